import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import UbiquityModel
import UbiquityStore

/// The body of a GET written into a file as it arrives, and hashed on the
/// way: a blob goes straight into a download's partial file. Accumulating it
/// instead (`ResponseAccumulator`) grows a buffer to the blob's size, copies
/// it into `Data`, and `pwrite` copies it once more.
///
/// Only a successful answer (2xx) goes to the file, and never more than the
/// sink's `count` bytes: an object of another size is refused before
/// anything past the sink's range is touched (the bytes after it may be
/// another chunk, already verified). An error answer's body is kept in
/// memory, its first 64 KiB, for its S3 error code.
///
/// AHC calls a delegate's methods one at a time, on the request's event
/// loop, hence `@unchecked Sendable` for the mutable state. The writes run
/// there too: a write into the page cache is short, but a disk that makes
/// writers wait for dirty pages slows the other requests on that loop.
final class BodyToFile: HTTPClientResponseDelegate, @unchecked Sendable {
    typealias Response = S3Client.Response

    let sink: S3Client.FileSink
    /// The request, for errors.
    let what: String
    var head: HTTPResponseHead?
    var hasher = ContentHasher()
    var received = 0
    var errorBody = Data()

    init(_ sink: S3Client.FileSink, what: String) {
        self.sink = sink
        self.what = what
    }

    var succeeded: Bool { head.map { (200..<300).contains($0.status.code) } ?? false }

    func didReceiveHead(task: HTTPClient.Task<Response>, _ head: HTTPResponseHead) -> EventLoopFuture<Void> {
        self.head = head
        if succeeded, let declared = head.headers.first(name: "content-length").flatMap(Int.init), declared != sink.count {
            return task.eventLoop.makeFailedFuture(wrongSize("\(declared) bytes"))
        }
        return task.eventLoop.makeSucceededVoidFuture()
    }

    func didReceiveBodyPart(task: HTTPClient.Task<Response>, _ buffer: ByteBuffer) -> EventLoopFuture<Void> {
        let at = received
        received += buffer.readableBytes
        guard succeeded else {
            let room = max(0, (64 << 10) - errorBody.count)
            errorBody.append(contentsOf: buffer.readableBytesView.prefix(room))
            return task.eventLoop.makeSucceededVoidFuture()
        }
        guard received <= sink.count else { return task.eventLoop.makeFailedFuture(wrongSize("more than \(sink.count) bytes")) }
        do {
            try buffer.withUnsafeReadableBytes { bytes in
                try ContentCopy.write(bytes, to: sink.fd, at: sink.offset + UInt64(at))
                hasher.update(bytes)
            }
        } catch let error as UbiquityError {
            return task.eventLoop.makeFailedFuture(S3Client.Refused(error: error))
        } catch {
            return task.eventLoop.makeFailedFuture(error)
        }
        return task.eventLoop.makeSucceededVoidFuture()
    }

    func didFinishRequest(task: HTTPClient.Task<Response>) throws -> Response {
        guard let head else { throw UbiquityError(EIO, "\(what): no answer") }
        var response = Response(status: Int(head.status.code), headers: head.headers, body: errorBody, received: received)
        if succeeded { response.written = (received, hasher.finish()) }
        return response
    }

    func wrongSize(_ size: String) -> S3Client.Refused {
        S3Client.Refused(error: UbiquityError(store: .damaged, "\(what) has \(size), not the \(sink.count) expected"))
    }
}
