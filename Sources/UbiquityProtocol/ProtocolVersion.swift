/// The version of the control protocol, `MAJOR.MINOR`, carried by every
/// request (`"protocol":"1.0"`) and by the final line of every answer.
///
/// The rule: peers talk when their majors are equal. A minor step only adds
/// (a new command, an optional field that may be missing); anything else — a
/// field removed or retyped, a new kind of line in an existing answer — is
/// a new major. A daemon refuses a request of another major, or without a
/// version (a ubiquityfs from before versioning), with `protocolMismatch`;
/// a client refuses an answer whose final line has another major or none.
public struct ProtocolVersion: Sendable, Hashable, Codable, CustomStringConvertible {
    public var major: Int
    public var minor: Int

    /// The version this build speaks.
    public static let current = ProtocolVersion(major: 1, minor: 3)

    public init(major: Int, minor: Int) {
        self.major = major
        self.minor = minor
    }

    /// "1.0" → 1.0; nil for anything else.
    public init?(_ text: String) {
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 2, let major = Int(parts[0]), let minor = Int(parts[1]), major >= 0, minor >= 0 else { return nil }
        self.init(major: major, minor: minor)
    }

    public func canTalk(to other: ProtocolVersion) -> Bool { major == other.major }

    public var description: String { "\(major).\(minor)" }

    public init(from decoder: any Decoder) throws {
        let text = try decoder.singleValueContainer().decode(String.self)
        guard let version = ProtocolVersion(text) else {
            throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath,
                                                    debugDescription: "'\(text)' is not a protocol version (MAJOR.MINOR)"))
        }
        self = version
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(description)
    }
}
