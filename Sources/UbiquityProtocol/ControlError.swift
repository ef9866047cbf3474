/// Why a control request got no result: the daemon's refusal or failure
/// (the `{"error":…}` line that ends an answer), or what the client saw
/// (nobody listening, no answer, an answer in another protocol).
///
/// On the wire: `{"error":MESSAGE,"code":CODE,"errno":N,"protocol":"1.0"}`.
/// `error` is a string in every version, so that a client of any version can
/// print why it was refused.
public struct ControlError: Error, Sendable, Equatable, Codable, CustomStringConvertible {
    public enum Code: String, Sendable, Codable {
        /// The peers speak different protocol majors (see `ProtocolVersion`).
        case protocolMismatch
        /// Not a JSON object, a field of the wrong type, a required field missing.
        case malformedRequest
        /// A request line longer than `ControlLimits.maximumRequestBytes`.
        case requestTooLarge
        /// No complete request line within `ControlLimits.requestTimeoutSeconds`.
        case requestTimeout
        /// A command this socket does not serve.
        case unknownCommand
        /// The command ran and failed; `errno` says how (ENOENT, EBUSY…).
        case failed
        /// Client side: nobody listens on the socket (`errno`: ENOENT, ECONNREFUSED…).
        case unreachable
        /// Client side: the daemon closed the connection without a final line.
        case noAnswer
    }

    public var code: Code
    public var message: String
    /// The errno the failure maps to, when it has one.
    public var errno: Int32?

    public init(_ code: Code, _ message: String, errno: Int32? = nil) {
        self.code = code
        self.message = message
        self.errno = errno
    }

    public var description: String { message }

    /// The refusal of a request in another protocol: what each side speaks,
    /// and the way out (unmounting with the ubiquityfs that mounted it).
    /// `client` nil: a request without a version (a ubiquityfs from before
    /// versioning); `daemon` nil: an answer without one, or with a line this
    /// version does not know.
    public static func protocolMismatch(client: ProtocolVersion?, daemon: ProtocolVersion?, daemonPID: Int32? = nil) -> ControlError {
        let clientSpeaks = client.map { "protocol \($0)" } ?? "an older protocol without versions"
        let daemonSpeaks = daemon.map { "protocol \($0)" } ?? "another protocol"
        let pid = daemonPID.map { "pid \($0), " } ?? ""
        let stop = daemonPID.map { "`kill \($0)`" } ?? "stop its daemon"
        return ControlError(.protocolMismatch,
                            "this ubiquityfs (\(clientSpeaks)) cannot talk to the running daemon (\(pid)\(daemonSpeaks)); "
                            + "unmount with the ubiquityfs that mounted it (or \(stop): pending changes stay queued), "
                            + "then mount again with this one")
    }

    enum Key: String, CodingKey { case error, code, errno }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: Key.self)
        message = try container.decode(String.self, forKey: .error)
        // A code this version does not know (a newer minor's) is still a failure.
        code = (try? container.decodeIfPresent(Code.self, forKey: .code)) ?? .failed
        errno = try container.decodeIfPresent(Int32.self, forKey: .errno)
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: Key.self)
        try container.encode(message, forKey: .error)
        try container.encode(code, forKey: .code)
        try container.encodeIfPresent(errno, forKey: .errno)
    }
}

/// What the daemon accepts from a client.
public enum ControlLimits {
    /// The longest request line (a query's predicate is the only part that grows).
    public static let maximumRequestBytes = 1 << 20
    /// How long a client may take to send its request line.
    public static let requestTimeoutSeconds = 30
}
