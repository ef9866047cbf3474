#if canImport(Glibc)
import Glibc
#endif
import Foundation

/// The one error type of UbiquityFS.
///
/// Every failure carries an errno and a message for people (logs, CLI),
/// and a failure of the store its kind (`StoreFailure`). A file operation
/// answers `fileOperationErrno`: the errno, or `EIO` for any failure of the
/// store. Foreign errors are wrapped with `EIO` by `UbiquityError.wrap(_:)`,
/// so nothing else escapes the core.
public struct UbiquityError: Error, CustomStringConvertible, Sendable {
    public var errno: Int32
    public var message: String
    /// What kind of store failure this is (nil: not the store's).
    public var store: StoreFailure?

    public init(_ errno: Int32, _ message: String = "") {
        self.errno = errno
        self.message = message
    }

    /// A failure of the store, with the errno of its kind.
    public init(store failure: StoreFailure, _ message: String) {
        self.init(failure.errno, message)
        store = failure
    }

    /// The errno a file operation answers with: the store's failures are
    /// `EIO` whatever their kind, since a program asked about its file, not
    /// about the store (a missing blob is not a missing file, refused
    /// credentials are not the file's permissions). The kind and message
    /// go to the log and `status`.
    public var fileOperationErrno: Int32 { store == nil ? errno : EIO }

    public var description: String {
        message.isEmpty ? String(cString: strerror(errno)) : message
    }

    /// Wrap any error: a `UbiquityError` passes through, anything else is `EIO`.
    public static func wrap(_ error: any Error, _ context: String = "") -> UbiquityError {
        if let e = error as? UbiquityError { return e }
        let text = context.isEmpty ? "\(error)" : "\(context): \(error)"
        return UbiquityError(EIO, text)
    }

    /// The same message (and store failure) with another errno (to keep the cause's errno, e.g. EHOSTDOWN).
    public func withErrno(_ code: Int32) -> UbiquityError {
        var e = self
        e.errno = code
        return e
    }

    /// The error of the last failed system call, with what was being done.
    public static func posix(_ context: String, errno code: Int32 = Glibc.errno) -> UbiquityError {
        UbiquityError(code, "\(context): \(String(cString: strerror(code)))")
    }
}

/// The kinds of store failure, each with the errno the store's callers
/// (the sync engine, the CLI) see.
public enum StoreFailure: Sendable, Equatable {
    /// The store cannot be reached or keeps failing: its folder is gone or
    /// no longer holds the marker this device knows, its server does not
    /// answer or answers 5xx (`EHOSTDOWN`).
    case unreachable
    /// The store refuses this device: credentials, permissions (`EACCES`).
    case refused
    /// Something the store should hold is missing, cut short or not what
    /// its name says (`EIO`).
    case damaged
    /// The store is of a format this build does not read (`EPROTONOSUPPORT`).
    case unsupported

    public var errno: Int32 {
        switch self {
        case .unreachable: EHOSTDOWN
        case .refused: EACCES
        case .damaged: EIO
        case .unsupported: EPROTONOSUPPORT
        }
    }
}
