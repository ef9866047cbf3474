#if canImport(Glibc)
import Glibc
#endif
import Foundation

/// The one error type of UbiquityFS.
///
/// Every failure carries the errno the filesystem would answer with and a
/// message for people (logs, CLI). Foreign errors are wrapped with `EIO`
/// by `UbiquityError.wrap(_:)`, so nothing else escapes the core.
public struct UbiquityError: Error, CustomStringConvertible, Sendable {
    public var errno: Int32
    public var message: String

    public init(_ errno: Int32, _ message: String = "") {
        self.errno = errno
        self.message = message
    }

    public var description: String {
        message.isEmpty ? String(cString: strerror(errno)) : message
    }

    /// Wrap any error: a `UbiquityError` passes through, anything else is `EIO`.
    public static func wrap(_ error: any Error, _ context: String = "") -> UbiquityError {
        if let e = error as? UbiquityError { return e }
        let text = context.isEmpty ? "\(error)" : "\(context): \(error)"
        return UbiquityError(EIO, text)
    }

    /// The same message with another errno (to keep the cause's errno, e.g. EHOSTDOWN).
    public func withErrno(_ code: Int32) -> UbiquityError { UbiquityError(code, message) }

    /// The error of the last failed system call, with what was being done.
    public static func posix(_ context: String, errno code: Int32 = Glibc.errno) -> UbiquityError {
        UbiquityError(code, "\(context): \(String(cString: strerror(code)))")
    }
}

