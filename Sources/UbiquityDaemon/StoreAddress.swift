import Foundation
import Logging
import UbiquityReplica
import UbiquityS3
import UbiquityModel
import UbiquityStore
#if canImport(Glibc)
import Glibc
#endif

/// Which store a command means, and how to reach it: a folder (an absolute
/// path) or an S3 location (`s3://BUCKET/PREFIX` with its server options).
/// Never holds a secret: S3 credentials are looked up the AWS way when the
/// store is opened (environment, `~/.aws/credentials`, `~/.aws/config`).
package struct StoreAddress: Codable, Sendable, Equatable {
    /// An absolute folder path, or `s3://BUCKET/PREFIX`.
    package var url: String
    package var endpoint: String?
    package var region: String?
    package var addressing: String?
    package var profile: String?

    package init(url: String, endpoint: String? = nil, region: String? = nil, addressing: String? = nil, profile: String? = nil) {
        self.url = url
        self.endpoint = endpoint
        self.region = region
        self.addressing = addressing
        self.profile = profile
    }

    package var isS3: Bool { S3Location.isS3URL(url) }

    /// One daemon per store and device: the key of its socket and of the
    /// store ID this device remembers for it.
    package var key: String {
        guard isS3 else { return url }
        return [url, endpoint ?? "aws", region ?? "", addressing ?? ""].joined(separator: " ")
    }

    /// The store as a daemon's status names it (`Store.locationDescription`).
    package var shownLocation: String { isS3 ? ((try? s3Location().description) ?? url) : url }

    /// What messages show.
    package var description: String { isS3 ? url + (endpoint.map { " at \($0)" } ?? "") : url }

    /// The arguments that give this store to `mount` (the spawned daemon).
    package var arguments: [String] {
        var args = ["--store", url]
        if let endpoint { args += ["--endpoint", endpoint] }
        if let region { args += ["--region", region] }
        if let addressing { args += ["--addressing", addressing] }
        if let profile { args += ["--profile", profile] }
        return args
    }

    /// The S3 location (throws on a malformed URL or option).
    package func s3Location() throws -> S3Location {
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

    package static var home: String { ProcessInfo.processInfo.environment["HOME"] ?? NSHomeDirectory() }

    /// Open an S3 store. `knownStoreID`: see `S3Store.init`.
    package func openS3(knownStoreID: String?) throws -> S3Store {
        let location = try s3Location()
        let credentials = try AWSCredentials.resolve(profile: profile, environment: ProcessInfo.processInfo.environment, home: Self.home)
        return try S3Store(location: location, credentials: credentials, knownStoreID: knownStoreID)
    }

    /// The file where this device keeps the ID of the store it used here.
    func knownStoreFile(_ locations: Locations) -> URL {
        locations.dataHome.appendingPathComponent("known-stores").appendingPathComponent(ContentCopy.hash(of: Data(key.utf8)))
    }

    /// The ID of the store this device used at this address; nil if it
    /// never used one here (no marker). A marker that is there but cannot be
    /// read is an error: taken for none, an emptied store here would be
    /// taken for a new one.
    package func readKnownStoreID(_ locations: Locations) throws -> String? {
        let file = knownStoreFile(locations)
        var st = stat()
        if lstat(file.path, &st) != 0 && errno == ENOENT { return nil }
        do {
            return try String(contentsOf: file, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        } catch {
            throw UbiquityError(EIO, "cannot read \(file.path), which records the store this device used at \(description): \(error.localizedDescription)")
        }
    }

    /// As `readKnownStoreID`; a marker that cannot be read is logged and taken for none.
    package func knownStoreID(_ locations: Locations) -> String? {
        do {
            return try readKnownStoreID(locations)
        } catch {
            Logger(label: "ubiquityfs").error("\(error)")
            return nil
        }
    }

    /// Record that this device uses store `id` at this address (the marker
    /// that stops an emptied store from being taken for a new one).
    package func recordStoreID(_ id: String, _ locations: Locations) throws {
        let file = knownStoreFile(locations)
        if (try? readKnownStoreID(locations)) == id { return }
        do {
            try FileManager.default.createDirectory(at: file.deletingLastPathComponent(), withIntermediateDirectories: true)
            try id.write(to: file, atomically: true, encoding: .utf8)
        } catch {
            throw UbiquityError(EIO, "cannot record store \(id) as used at \(description) in \(file.path) (without it, this store emptied would be taken for a new one): \(error.localizedDescription)")
        }
    }

    /// As `recordStoreID`; a failure is logged, and returned for the status.
    @discardableResult
    package func rememberStoreID(_ id: String, _ locations: Locations) -> (any Error)? {
        do {
            try recordStoreID(id, locations)
            return nil
        } catch {
            Logger(label: "ubiquityfs").error("\(error)")
            return error
        }
    }
}
