/// AWS Signature Version 4, header form ("Authorization: AWS4-HMAC-SHA256 …"),
/// written from AWS's documentation:
///   - IAM User Guide, "Create a signed AWS API request" (canonical request,
///     string to sign, signing key derivation);
///   - Amazon S3 API Reference, "Signature Calculations for the Authorization
///     Header: Transferring Payload in a Single Chunk" (S3's differences: the
///     path is encoded once and never normalized, x-amz-content-sha256 is signed).
///
/// Checked against AWS's generic SigV4 test suite and the S3 examples
/// (Tests/UbiquityS3Tests/SigV4Tests.swift). Presigned URLs and chunked
/// (streaming) payload signing are not implemented.
import Crypto
import Foundation
#if canImport(Glibc)
import Glibc
#endif

public struct SigV4Signer: Sendable {
    /// How the request path becomes the canonical URI.
    public enum PathRule: Sendable {
        /// S3: the path exactly as sent (already percent-encoded once) is the canonical URI.
        case asSent
        /// Percent-encode the path (again) without normalizing it.
        case encoded
        /// Other services: remove "." and ".." segments and empty segments, then percent-encode (again).
        case normalizedAndEncoded
    }

    public static let algorithm = "AWS4-HMAC-SHA256"
    /// `payloadHash` for a body that is not signed (S3 over HTTPS accepts it).
    public static let unsignedPayload = "UNSIGNED-PAYLOAD"
    /// `payloadHash` of an empty body.
    public static let emptyPayloadHash = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

    public var credentials: AWSCredentials
    public var region: String
    public var service: String
    public var pathRule: PathRule

    /// A signer with the path rule of `service`: `.asSent` for "s3", `.normalizedAndEncoded` otherwise.
    public init(credentials: AWSCredentials, region: String, service: String) {
        self.init(credentials: credentials, region: region, service: service,
                  pathRule: service == "s3" ? .asSent : .normalizedAndEncoded)
    }

    public init(credentials: AWSCredentials, region: String, service: String, pathRule: PathRule) {
        self.credentials = credentials
        self.region = region
        self.service = service
        self.pathRule = pathRule
    }

    /// Sign one request. `path` is the request path as it will be sent (already percent-encoded),
    /// `query` the query parameters *unencoded* (send `canonicalQueryString(query)` as the query),
    /// `headers` every header to sign (must include "host"). `payloadHash` is the hex SHA-256 of the
    /// body or `unsignedPayload`. Returns the headers to add to the request: "x-amz-date",
    /// "x-amz-security-token" (with a session token), "x-amz-content-sha256" (service "s3"), "authorization".
    /// Headers of those names in `headers` are replaced by the signer's own.
    public func sign(method: String, path: String, query: [(String, String)], headers: [(String, String)],
                     payloadHash: String, date: Date) -> [(String, String)] {
        let request = prepare(method: method, path: path, query: query, headers: headers,
                              payloadHash: payloadHash, date: date)
        let day = String(request.amzDate.prefix(8))
        let scope = "\(day)/\(region)/\(service)/aws4_request"
        let stringToSign = [Self.algorithm, request.amzDate, scope, Self.sha256Hex(Data(request.text.utf8))]
            .joined(separator: "\n")
        var key = Self.hmac(Data("AWS4\(credentials.secretAccessKey)".utf8), day)
        for part in [region, service, "aws4_request"] { key = Self.hmac(key, part) }
        let signature = Self.hex(Self.hmac(key, stringToSign))
        let authorization = "\(Self.algorithm) Credential=\(credentials.accessKeyID)/\(scope), "
            + "SignedHeaders=\(request.signedHeaders), Signature=\(signature)"
        return request.added + [("authorization", authorization)]
    }

    /// The canonical request `sign` signs (to compare with the one S3 returns with SignatureDoesNotMatch).
    public func canonicalRequest(method: String, path: String, query: [(String, String)], headers: [(String, String)],
                                 payloadHash: String, date: Date) -> String {
        prepare(method: method, path: path, query: query, headers: headers, payloadHash: payloadHash, date: date).text
    }

    /// Parameters sorted by encoded name, then encoded value; "name=value" joined by "&" ("lifecycle=" for a bare name).
    public static func canonicalQueryString(_ query: [(String, String)]) -> String {
        query.map { (uriEncode($0.0, encodeSlash: true), uriEncode($0.1, encodeSlash: true)) }
            .sorted { $0.0 != $1.0 ? $0.0.utf8.lexicographicallyPrecedes($1.0.utf8) : $0.1.utf8.lexicographicallyPrecedes($1.1.utf8) }
            .map { "\($0.0)=\($0.1)" }
            .joined(separator: "&")
    }

    /// Percent-encode the UTF-8 bytes of `s`: A-Z a-z 0-9 - _ . ~ are kept, "/" too unless `encodeSlash`,
    /// everything else becomes %XX (uppercase hex).
    public static func uriEncode(_ s: String, encodeSlash: Bool) -> String {
        let digits = Array("0123456789ABCDEF".utf8)
        var out: [UInt8] = []
        out.reserveCapacity(s.utf8.count)
        for byte in s.utf8 {
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
                 UInt8(ascii: "0")...UInt8(ascii: "9"),
                 UInt8(ascii: "-"), UInt8(ascii: "_"), UInt8(ascii: "."), UInt8(ascii: "~"):
                out.append(byte)
            case UInt8(ascii: "/") where !encodeSlash:
                out.append(byte)
            default:
                out += [UInt8(ascii: "%"), digits[Int(byte >> 4)], digits[Int(byte & 0x0F)]]
            }
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// Lowercase hex SHA-256 of `data` (for `payloadHash`).
    public static func sha256Hex(_ data: Data) -> String { hex(Data(SHA256.hash(data: data))) }

    /// `date` as SigV4 wants it: UTC, yyyyMMdd'T'HHmmss'Z'.
    public static func amzDate(_ date: Date) -> String {
        var seconds = time_t(date.timeIntervalSince1970.rounded(.down))
        var parts = tm()
        gmtime_r(&seconds, &parts)
        return String(format: "%04d%02d%02dT%02d%02d%02dZ", Int(parts.tm_year) + 1900, Int(parts.tm_mon) + 1,
                      Int(parts.tm_mday), Int(parts.tm_hour), Int(parts.tm_min), Int(parts.tm_sec))
    }

    // MARK: - Canonical request

    private struct Prepared {
        var text: String
        var signedHeaders: String
        var amzDate: String
        var added: [(String, String)]
    }

    private func prepare(method: String, path: String, query: [(String, String)], headers: [(String, String)],
                         payloadHash: String, date: Date) -> Prepared {
        let amzDate = Self.amzDate(date)
        var added = [("x-amz-date", amzDate)]
        if let token = credentials.sessionToken { added.append(("x-amz-security-token", token)) }
        if service == "s3" { added.append(("x-amz-content-sha256", payloadHash)) }
        let replaced = Set(added.map(\.0) + ["authorization"])

        // Lowercased names, sorted; values trimmed with inner whitespace runs collapsed, repeats joined by ",".
        var values: [String: [String]] = [:]
        for (name, value) in headers where !replaced.contains(name.lowercased()) {
            values[name.lowercased(), default: []].append(Self.collapsingWhitespace(value))
        }
        for (name, value) in added { values[name] = [value] }
        let names = values.keys.sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) }
        let canonicalHeaders = names.map { "\($0):\(values[$0]!.joined(separator: ","))\n" }.joined()
        let signedHeaders = names.joined(separator: ";")

        let uri: String
        switch pathRule {
        case .asSent: uri = path.isEmpty ? "/" : path
        case .encoded: uri = Self.uriEncode(path.isEmpty ? "/" : path, encodeSlash: false)
        case .normalizedAndEncoded: uri = Self.uriEncode(Self.normalized(path), encodeSlash: false)
        }
        let text = [method, uri, Self.canonicalQueryString(query), canonicalHeaders, signedHeaders, payloadHash]
            .joined(separator: "\n")
        return Prepared(text: text, signedHeaders: signedHeaders, amzDate: amzDate, added: added)
    }

    /// Trimmed, with every run of spaces, tabs and line breaks (folded lines) made one space.
    static func collapsingWhitespace(_ value: String) -> String {
        value.split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "\r" || $0 == "\n" || $0 == "\r\n" })
            .joined(separator: " ")
    }

    /// RFC 3986 dot-segment removal, with empty segments dropped too; keeps a trailing "/".
    static func normalized(_ path: String) -> String {
        var kept: [Substring] = []
        let segments = path.split(separator: "/", omittingEmptySubsequences: false)
        for segment in segments {
            switch segment {
            case "", ".": continue
            case "..": _ = kept.popLast()
            default: kept.append(segment)
            }
        }
        let last = segments.last ?? ""
        let trailingSlash = !kept.isEmpty && (last.isEmpty || last == "." || last == "..")
        return "/" + kept.joined(separator: "/") + (trailingSlash ? "/" : "")
    }

    private static func hmac(_ key: Data, _ message: String) -> Data {
        Data(HMAC<SHA256>.authenticationCode(for: Data(message.utf8), using: SymmetricKey(data: key)))
    }

    private static func hex(_ bytes: Data) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count * 2)
        for byte in bytes { out += [digits[Int(byte >> 4)], digits[Int(byte & 0x0F)]] }
        return String(decoding: out, as: UTF8.self)
    }
}
