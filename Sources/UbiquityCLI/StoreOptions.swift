import ArgumentParser
import Foundation
import UbiquityDaemon
import UbiquityS3
#if canImport(Glibc)
import Glibc
import UbiquityModel
#endif

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
