import UbiquityLocks

/// How a thread says it is about to wait for something slow (a download),
/// so that the FUSE loop, if the thread is the one reading the mount's
/// requests, has another worker take over the reading first
/// (`CFuseWire/fuseloop.h`). The FUSE adapter installs the hook; without
/// one, nothing happens.
public enum LongWait {
    private static let hook = Lock<(@Sendable () -> Void)?>(nil)

    public static func install(_ body: @escaping @Sendable () -> Void) {
        hook.withLock { $0 = body }
    }

    /// The calling thread is about to wait.
    public static func begins() {
        hook.withLock { $0 }?()
    }
}
