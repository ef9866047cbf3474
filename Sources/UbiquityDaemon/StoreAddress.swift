import ArgumentParser
import Foundation
import UbiquityReplica
import UbiquityS3
import UbiquityStore
#if canImport(Glibc)
import Glibc
#endif

/// Which store a command means, and how to reach it: a folder (an absolute
/// path) or an S3 location (`s3://BUCKET/PREFIX` with its server options).
/// Never holds a secret: S3 credentials are looked up the AWS way when the
/// store is opened (environment, `~/.aws/credentials`, `~/.aws/config`).
struct StoreAddress: Codable, Sendable, Equatable {
    /// An absolute folder path, or `s3://BUCKET/PREFIX`.
    var url: String
    var endpoint: String?
    var region: String?
    var addressing: String?
    var profile: String?

    var isS3: Bool { S3Location.isS3URL(url) }

    /// One daemon per store and device: the key of its socket and of the
    /// store ID this device remembers for it.
    var key: String {
        guard isS3 else { return url }
        return [url, endpoint ?? "aws", region ?? "", addressing ?? ""].joined(separator: " ")
    }

    /// The store as a daemon's status names it (`Store.locationDescription`).
    var shownLocation: String { isS3 ? ((try? s3Location().description) ?? url) : url }

    /// What messages show.
    var description: String { isS3 ? url + (endpoint.map { " at \($0)" } ?? "") : url }

    /// The arguments that give this store to `mount` (the spawned daemon).
    var arguments: [String] {
        var args = ["--store", url]
        if let endpoint { args += ["--endpoint", endpoint] }
        if let region { args += ["--region", region] }
        if let addressing { args += ["--addressing", addressing] }
        if let profile { args += ["--profile", profile] }
        return args
    }

    /// The S3 location (throws on a malformed URL or option).
    func s3Location() throws -> S3Location {
        let environment = ProcessInfo.processInfo.environment
        let region = region ?? AWSCredentials.region(profile: profile, environment: environment, home: Self.home)
        let style = try addressing.map { value -> S3Location.Addressing in
            guard let style = S3Location.Addressing(rawValue: value) else {
                throw UbiquityError(EINVAL, "--addressing must be path or virtual (got '\(value)')")
            }
            return style
        }
        return try S3Location(url: url, endpoint: endpoint, region: region, addressing: style)
    }

    static var home: String { ProcessInfo.processInfo.environment["HOME"] ?? NSHomeDirectory() }

    /// Open an S3 store. `knownStoreID`: see `S3Store.init`.
    func openS3(knownStoreID: String?) throws -> S3Store {
        let location = try s3Location()
        let credentials = try AWSCredentials.resolve(profile: profile, environment: ProcessInfo.processInfo.environment, home: Self.home)
        return try S3Store(location: location, credentials: credentials, knownStoreID: knownStoreID)
    }

    /// The file where this device keeps the ID of the store it used here.
    func knownStoreFile(_ locations: Locations) -> URL {
        locations.dataHome.appendingPathComponent("known-stores").appendingPathComponent(ContentCopy.hash(of: Data(key.utf8)))
    }

    func knownStoreID(_ locations: Locations) -> String? {
        (try? String(contentsOf: knownStoreFile(locations), encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    func rememberStoreID(_ id: String, _ locations: Locations) {
        let file = knownStoreFile(locations)
        try? FileManager.default.createDirectory(at: file.deletingLastPathComponent(), withIntermediateDirectories: true)
        try? id.write(to: file, atomically: true, encoding: .utf8)
    }
}

/// The options that name a store, shared by every command that opens one.
struct StoreOptions: ParsableArguments {
    @Option(help: "The store: a folder's path (must exist; an empty folder becomes a new store) or s3://BUCKET/PREFIX (default: the folder store in $XDG_DATA_HOME/ubiquityfs/store, or the store this mountpoint used last).")
    var store: String?
    @Option(help: "With an s3:// store: the server, http(s)://HOST[:PORT] (default: AWS S3 in --region).")
    var endpoint: String?
    @Option(help: "With an s3:// store: the region (default: AWS_REGION, AWS_DEFAULT_REGION, the profile's region, else us-east-1).")
    var region: String?
    @Option(help: "With an s3:// store: path or virtual (default: virtual on AWS, path with --endpoint).")
    var addressing: String?
    @Option(help: "With an s3:// store: the AWS profile for credentials (default: AWS_PROFILE, else default). Credentials come from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/AWS_SESSION_TOKEN or ~/.aws/credentials and ~/.aws/config; they are never written by ubiquityfs.")
    var profile: String?

    func validate() throws {
        if let store, store.isEmpty { throw ValidationError("--store is empty: name a folder or s3://BUCKET/PREFIX") }
        let s3Only = [("--endpoint", endpoint), ("--region", region), ("--addressing", addressing), ("--profile", profile)]
        if store.map(S3Location.isS3URL) != true, let given = s3Only.first(where: { $0.1 != nil }) {
            throw ValidationError("\(given.0) is for s3:// stores; give --store s3://BUCKET/PREFIX" + (store.map { " (\($0) is a folder)" } ?? ""))
        }
        if let address = address, address.isS3 {
            do { _ = try address.s3Location() } catch { throw ValidationError(UbiquityError.wrap(error).message) }
        }
    }

    /// The store named on the command line, if any (folders made absolute).
    var address: StoreAddress? {
        guard let store else { return nil }
        if S3Location.isS3URL(store) {
            return StoreAddress(url: store, endpoint: endpoint, region: region, addressing: addressing, profile: profile)
        }
        return StoreAddress(url: absolutePath(store))
    }
}

/// Stores remembered per mountpoint, so that a later `mount MOUNTPOINT`
/// without `--store` finds the store it used:
/// `$XDG_CONFIG_HOME/ubiquityfs/mounts.json` (owner-only), mountpoint →
/// store address. It never holds a secret.
enum RememberedStores {
    static var file: URL {
        let environment = ProcessInfo.processInfo.environment
        let base = environment["XDG_CONFIG_HOME"].flatMap { $0.hasPrefix("/") ? URL(fileURLWithPath: $0) : nil }
            ?? URL(fileURLWithPath: StoreAddress.home).appendingPathComponent(".config")
        return base.appendingPathComponent("ubiquityfs").appendingPathComponent("mounts.json")
    }

    static func load() throws -> [String: StoreAddress] {
        guard let data = FileManager.default.contents(atPath: file.path) else { return [:] }
        do {
            return try JSONDecoder().decode([String: StoreAddress].self, from: data)
        } catch {
            throw UbiquityError(EINVAL, "\(file.path) is damaged (\(error.localizedDescription)); fix or remove it, or give --store")
        }
    }

    static func store(for mountpoint: String) throws -> StoreAddress? { try load()[mountpoint] }

    /// Remember `address` for `mountpoint` (the default store is not written down).
    static func remember(_ address: StoreAddress?, for mountpoint: String) {
        guard var all = try? load() else { return }
        guard all[mountpoint] != address else { return }
        all[mountpoint] = address
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        guard let data = try? encoder.encode(all) else { return }
        let directory = file.deletingLastPathComponent()
        try? FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let tmp = directory.appendingPathComponent(".mounts.json.\(getpid())")
        guard FileManager.default.createFile(atPath: tmp.path, contents: data, attributes: [.posixPermissions: 0o600]) else { return }
        chmod(tmp.path, 0o600)
        rename(tmp.path, file.path)
    }
}
