import Foundation
import Logging
#if canImport(Glibc)
import Glibc
#endif

/// A swift-log handler writing timestamped lines to file descriptors
/// (the daemon's log file, and stderr in `--foreground`).
struct LineLogHandler: LogHandler {
    let descriptors: [Int32]
    let label: String
    var logLevel: Logger.Level = .info
    var metadata: Logger.Metadata = [:]

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        var tm = tm()
        var seconds = ts.tv_sec
        localtime_r(&seconds, &tm)
        let stamp = String(format: "%04d-%02d-%02d %02d:%02d:%02d.%03d", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                           tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1_000_000)
        let line = "\(stamp) \(event.level) \(event.message)\n"
        for fd in descriptors {
            _ = line.withCString { Glibc.write(fd, $0, strlen($0)) }
        }
    }
}

enum LogSetup {
    nonisolated(unsafe) static var bootstrapped = false

    static func bootstrap(descriptors: [Int32], level: Logger.Level) {
        guard !bootstrapped else { return }
        bootstrapped = true
        LoggingSystem.bootstrap { label in
            var handler = LineLogHandler(descriptors: descriptors, label: label)
            handler.logLevel = level
            return handler
        }
    }
}
