import Foundation
import UbiquityModel

/// Where an S3 store lives: a bucket, a key prefix in it, and the server.
///
/// Written `s3://BUCKET/PREFIX` by users; the server is AWS
/// (`https://s3.REGION.amazonaws.com`, virtual-hosted addressing) unless an
/// endpoint is given (then path-style addressing, which every
/// S3-compatible server understands, unless asked otherwise).
public struct S3Location: Sendable, Equatable, CustomStringConvertible {
    public enum Addressing: String, Sendable, CaseIterable {
        /// `https://HOST/BUCKET/KEY`
        case path
        /// `https://BUCKET.HOST/KEY`
        case virtual
    }

    public var bucket: String
    /// "" or a prefix ending in "/" that every key of the store starts with.
    public var prefix: String
    /// scheme://host[:port], no path.
    public var endpoint: URL
    public var region: String
    public var addressing: Addressing

    /// `s3://bucket/prefix` (what users type, and what status shows).
    public var description: String { "s3://\(bucket)/\(prefix.hasSuffix("/") ? String(prefix.dropLast()) : prefix)" }

    /// Whether `text` names an S3 store rather than a folder.
    public static func isS3URL(_ text: String) -> Bool { text.hasPrefix("s3://") }

    /// Parse `s3://BUCKET[/PREFIX]` with the server options of `mount`.
    public init(url text: String, endpoint: String?, region: String?, addressing: Addressing? = nil) throws {
        guard Self.isS3URL(text) else { throw UbiquityError(EINVAL, "'\(text)' is not an S3 URL (s3://BUCKET/PREFIX)") }
        let rest = text.dropFirst("s3://".count)
        let bucket = String(rest.prefix { $0 != "/" })
        guard Self.isValidBucket(bucket) else {
            throw UbiquityError(EINVAL, "'\(bucket)' in \(text) is not a bucket name (3 to 63 characters: lowercase letters, digits, '.', '-')")
        }
        var prefix = String(rest.dropFirst(bucket.count)).trimmingCharacters(in: CharacterSet(charactersIn: "/"))
        guard !prefix.contains("//"), prefix.utf8.count <= 512, !prefix.unicodeScalars.contains(where: { $0.value < 0x20 || $0 == "\u{7f}" }) else {
            throw UbiquityError(EINVAL, "the key prefix in \(text) must not contain '//' or control characters, and is at most 512 bytes")
        }
        if !prefix.isEmpty { prefix += "/" }
        let region = region ?? "us-east-1"
        guard !region.isEmpty, region.allSatisfy({ $0.isLetter || $0.isNumber || $0 == "-" }) else {
            throw UbiquityError(EINVAL, "--region '\(region)' is not a region name (like eu-west-1)")
        }
        let endpointURL: URL
        if let endpoint {
            guard let url = URL(string: endpoint), let scheme = url.scheme?.lowercased(), scheme == "http" || scheme == "https",
                  let host = url.host, !host.isEmpty, url.path.isEmpty || url.path == "/", url.query == nil, url.user == nil else {
                throw UbiquityError(EINVAL, "--endpoint '\(endpoint)' must be http(s)://HOST[:PORT] with no path")
            }
            endpointURL = URL(string: "\(scheme)://\(host)\(url.port.map { ":\($0)" } ?? "")")!
        } else {
            endpointURL = URL(string: "https://s3.\(region).amazonaws.com")!
        }
        // Virtual-hosted addressing puts the bucket in the host name: a bucket
        // with dots breaks TLS's wildcard certificate, so those use paths.
        let defaultAddressing: Addressing = endpoint == nil && !bucket.contains(".") ? .virtual : .path
        self.bucket = bucket
        self.prefix = prefix
        self.endpoint = endpointURL
        self.region = region
        self.addressing = addressing ?? defaultAddressing
    }

    static func isValidBucket(_ name: String) -> Bool {
        let allowed = Set("abcdefghijklmnopqrstuvwxyz0123456789.-")
        return (3...63).contains(name.count) && name.allSatisfy(allowed.contains)
            && name.first != "." && name.first != "-" && name.last != "." && name.last != "-" && !name.contains("..")
    }

    /// The host the requests go to (with the port when it is not the scheme's default).
    var host: String {
        let base = endpoint.host!
        let port = endpoint.port.map { ":\($0)" } ?? ""
        return addressing == .virtual ? "\(bucket).\(base)\(port)" : "\(base)\(port)"
    }

    /// The request path of `key` (percent-encoded, as sent and signed), or of
    /// the bucket itself when `key` is nil.
    func path(of key: String?) -> String {
        let encodedKey = key.map { SigV4Signer.uriEncode($0, encodeSlash: false) }
        switch addressing {
        case .path: return "/\(bucket)" + (encodedKey.map { "/\($0)" } ?? "")
        case .virtual: return "/" + (encodedKey ?? "")
        }
    }
}
