import CFuseWire
import Foundation
import Logging
import Synchronization
import UbiquityFS
import UbiquityModel

/// The kernel's registry of backing files for one session (FUSE
/// passthrough): `FUSE_DEV_IOC_BACKING_OPEN` and `_CLOSE` on its /dev/fuse.
///
/// The kernel may still refuse (a capability missing in a container, a
/// file system it cannot pass through to): the first refusal of that kind
/// is logged and every later open is served the ordinary way.
final class KernelBackingFiles: BackingFiles {
    let deviceFD: Int32
    let logger: Logger
    private let refused = Atomic<Bool>(false)

    init(deviceFD: Int32, logger: Logger) {
        self.deviceFD = deviceFD
        self.logger = logger
    }

    func register(fd: Int32) throws -> Int32 {
        guard !refused.load(ordering: .relaxed) else { throw UbiquityError(EOPNOTSUPP) }
        let id = ubq_backing_open(deviceFD, fd)
        if id > 0 { return id }
        let code = -id
        if code == EPERM || code == EOPNOTSUPP || code == ENOTTY || code == EINVAL || code == ELOOP,
           !refused.exchange(true, ordering: .relaxed) {
            logger.notice("the kernel refused a backing file (\(String(cString: strerror(code)))): files are read through the daemon")
        }
        throw UbiquityError(code, "register a backing file")
    }

    func unregister(_ id: Int32) {
        let rc = ubq_backing_close(deviceFD, id)
        if rc != 0 { logger.warning("forget backing file \(id): \(String(cString: strerror(-rc)))") }
    }
}
