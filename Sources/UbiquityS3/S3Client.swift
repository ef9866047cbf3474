import AsyncHTTPClient
import Crypto
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import Synchronization
import UbiquityModel

/// Signed S3 requests over async-http-client, for callers that block (the
/// sync engine's threads; never an event loop).
///
/// Every request is retried with exponential back-off and full jitter on what
/// is worth retrying — 5xx, 429, 408, timeouts, refused or reset connections,
/// bodies cut short — at most `maxAttempts` times; a request that stalls is
/// abandoned after its deadline. What remains after the retries is one
/// `UbiquityError`:
/// - `EFBIG`: the answer is larger than the caller allows (never retried);
/// - `EHOSTDOWN`: the store cannot be reached or keeps failing (the mount
///   works offline, never reading this as "deleted");
/// - `EACCES`: the credentials are refused (403);
/// - `ENOENT`: the bucket does not exist;
/// - `EIO`: anything else the server said no to.
/// Secrets never appear in an error or the log.
public final class S3Client: Sendable {
    public struct Response: Sendable {
        public var status: Int
        public var headers: HTTPHeaders
        /// The answer's body; for a GET `into` a file, only an error answer's
        /// (its first 64 KiB), the rest went to the file.
        public var body: Data
        /// For a successful GET `into` a file: how many bytes were written
        /// there, and their hash.
        public var written: (count: Int, hash: String)?
        /// How many body bytes arrived (checked against `content-length`).
        var received: Int
        /// The S3 error code in an error body (`NoSuchKey`, `PreconditionFailed`…).
        public var errorCode: String? { Self.xmlValue("Code", in: body) }

        static func xmlValue(_ tag: String, in body: Data) -> String? {
            guard let text = String(data: body.prefix(64 << 10), encoding: .utf8),
                  let open = text.range(of: "<\(tag)>"),
                  let close = text.range(of: "</\(tag)>", range: open.upperBound..<text.endIndex) else { return nil }
            return String(text[open.upperBound..<close.lowerBound])
        }
    }

    /// Where a GET's body goes instead of memory: `count` bytes of `fd` from
    /// `offset`. Nothing is written past them: a longer body is refused.
    public struct FileSink: Sendable {
        public var fd: Int32
        public var offset: UInt64
        public var count: Int
        public init(fd: Int32, offset: UInt64, count: Int) {
            self.fd = fd
            self.offset = offset
            self.count = count
        }
    }

    /// What fails a request for a reason on this side, never retried: the
    /// file a body goes into cannot be written, or the body is not the size
    /// the caller knows it must have.
    struct Refused: Error {
        var error: UbiquityError
    }

    public let location: S3Location
    let signer: SigV4Signer
    let http: HTTPClient
    /// Made when used: the store may be opened before logging is set up.
    var logger: Logger { Logger(label: "ubiquityfs.s3") }
    public static let maxAttempts = 5
    /// Longest a request (sending and receiving up to one 4 MiB chunk) may take.
    static let requestDeadline = TimeAmount.seconds(60)
    /// Exponentially weighted round-trip time of successful requests, in µs (for status).
    let latency = Atomic<Int>(0)
    let requestCount = Atomic<Int>(0)

    public init(location: S3Location, credentials: AWSCredentials) {
        self.location = location
        self.signer = SigV4Signer(credentials: credentials, region: location.region, service: "s3")
        var pool = HTTPClient.Configuration.ConnectionPool(idleTimeout: .seconds(30))
        pool.concurrentHTTP1ConnectionsPerHostSoftLimit = 32
        let configuration = HTTPClient.Configuration(
            redirectConfiguration: .disallow,
            timeout: .init(connect: .seconds(3), read: .seconds(10), write: .seconds(10)),
            connectionPool: pool,
            decompression: .disabled)
        http = HTTPClient(eventLoopGroupProvider: .singleton, configuration: configuration)
    }

    deinit {
        try? http.syncShutdown()
    }

    /// The last round-trip time, in milliseconds (nil before the first request).
    public var roundTripMilliseconds: Double? {
        let micros = latency.load(ordering: .relaxed)
        return micros == 0 ? nil : Double(micros) / 1000
    }

    /// Send one request and wait for its whole answer, retrying what is
    /// transient. `expect` lists the statuses the caller handles itself
    /// (404 for "not there", 412 for a lost race…); any other non-2xx is an
    /// error. `retryStatus` decides whether a status is worth another try
    /// (the default: 5xx, 429, 408). With `into`, a successful answer's body
    /// is written to the file as it arrives (`Response.written`); a try that
    /// fails after writing part of it is simply written over by the next.
    public func send(_ method: HTTPMethod, key: String?, query: [(String, String)] = [], headers extra: [(String, String)] = [],
                     body: Data? = nil, expect: Set<Int> = [], attempts: Int = S3Client.maxAttempts,
                     maxBody: Int = S3Client.maxBodyBytes, into sink: FileSink? = nil,
                     retryStatus: (Response) -> Bool = S3Client.isTransient) throws -> Response {
        var attempt = 0
        while true {
            attempt += 1
            let outcome: Result<Response, any Error>
            do {
                outcome = .success(try sendOnce(method, key: key, query: query, headers: extra, body: body, maxBody: maxBody, sink: sink))
            } catch let error as ResponseAccumulator.ResponseTooBigError {
                throw UbiquityError(EFBIG, "\(method) \(key ?? "/") in \(location): the answer is larger than \(error.maxBodySize) bytes")
            } catch let refused as Refused {
                throw refused.error
            } catch {
                outcome = .failure(error)
            }
            switch outcome {
            case .success(let response):
                if (200..<300).contains(response.status) || expect.contains(response.status) { return response }
                if retryStatus(response), attempt < attempts {
                    logger.debug("s3: \(method) \(key ?? "/"): \(response.status) \(response.errorCode ?? ""), retrying")
                    backOff(attempt)
                    continue
                }
                throw error(for: response, method: method, key: key, attempts: attempt)
            case .failure(let failure):
                // The connection pool already kept trying to connect for the
                // connect timeout: a server that cannot be reached is not tried again.
                if attempt < attempts && !Self.isConnectFailure(failure) {
                    logger.debug("s3: \(method) \(key ?? "/"): \(failure), retrying")
                    backOff(attempt)
                    continue
                }
                throw UbiquityError(store: .unreachable, "store \(location) is not reachable: \(Self.describe(failure)) (\(attempt) tries)")
            }
        }
    }

    static func isConnectFailure(_ error: any Error) -> Bool {
        if let error = error as? HTTPClientError, error == .connectTimeout || error == .getConnectionFromPoolTimeout { return true }
        let text = String(describing: error)
        return text.contains("Connection refused") || text.contains("connect(") || text.contains("No route to host")
            || text.contains("Network is unreachable") || text.contains("NIOConnectionError")
    }

    public static func isTransient(_ response: Response) -> Bool {
        response.status >= 500 || response.status == 429 || response.status == 408
    }

    /// Full jitter: a random wait up to 50 ms × 2^attempt, at most 2 s.
    func backOff(_ attempt: Int) {
        let cap = min(2.0, 0.05 * pow(2, Double(attempt)))
        Thread.sleep(forTimeInterval: Double.random(in: cap / 4...cap))
    }

    /// The largest answer read (a hostile object is refused, not loaded):
    /// far more than a chunk (4 MiB) or a listing page.
    public static let maxBodyBytes = 64 << 20

    func sendOnce(_ method: HTTPMethod, key: String?, query: [(String, String)], headers extra: [(String, String)], body: Data?,
                  maxBody: Int, sink: FileSink?) throws -> Response {
        let path = location.path(of: key)
        let queryString = SigV4Signer.canonicalQueryString(query)
        let payload = body ?? Data()
        let payloadHash = SigV4Signer.sha256Hex(payload)
        var headers: [(String, String)] = [("host", location.host)] + extra
        if body != nil { headers.append(("content-length", String(payload.count))) }
        headers += signer.sign(method: method.rawValue, path: path, query: query, headers: headers,
                               payloadHash: payloadHash, date: Date())
        let url = "\(location.endpoint.scheme!)://\(location.host)\(path)\(queryString.isEmpty ? "" : "?" + queryString)"
        var request = try HTTPClient.Request(url: url, method: method)
        for (name, value) in headers where name != "content-length" { request.headers.replaceOrAdd(name: name, value: value) }
        if let body { request.body = .bytes(body) }
        let started = DispatchTime.now().uptimeNanoseconds
        let deadline = NIODeadline.now() + Self.requestDeadline
        let response: Response
        if let sink {
            let writer = BodyToFile(sink, what: "\(method) \(key.map { "s3://\(location.bucket)/\($0)" } ?? "/")")
            response = try http.execute(request: request, delegate: writer, deadline: deadline).futureResult.wait()
        } else {
            let accumulator = ResponseAccumulator(request: request, maxBodySize: maxBody)
            let answer = try http.execute(request: request, delegate: accumulator, deadline: deadline).futureResult.wait()
            let data = answer.body.map { Data($0.readableBytesView) } ?? Data()
            response = Response(status: Int(answer.status.code), headers: answer.headers, body: data, received: data.count)
        }
        let elapsed = Int((DispatchTime.now().uptimeNanoseconds - started) / 1000)
        // A body cut short (the connection closed early) is a failed request, never data.
        if method != .HEAD, let declared = response.headers.first(name: "content-length").flatMap(Int.init), declared != response.received {
            throw UbiquityError(EIO, "the answer was cut short (\(response.received) of \(declared) bytes)")
        }
        let previous = latency.load(ordering: .relaxed)
        latency.store(previous == 0 ? elapsed : (previous * 7 + elapsed) / 8, ordering: .relaxed)
        requestCount.add(1, ordering: .relaxed)
        return response
    }

    func error(for response: Response, method: HTTPMethod, key: String?, attempts: Int) -> UbiquityError {
        let code = response.errorCode ?? "HTTP \(response.status)"
        let message = Response.xmlValue("Message", in: response.body).map { ": \($0)" } ?? ""
        let what = "\(method) \(key.map { "s3://\(location.bucket)/\($0)" } ?? "s3://\(location.bucket)")"
        switch (response.status, code) {
        case (_, "NoSuchBucket"):
            return UbiquityError(ENOENT, "bucket \(location.bucket) does not exist at \(location.endpoint.absoluteString)")
        case (403, _), (_, "InvalidAccessKeyId"), (_, "SignatureDoesNotMatch"), (_, "AccessDenied"):
            return UbiquityError(store: .refused, "the store \(location) refused the credentials (\(code)\(message)); check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or the profile")
        case (let status, _) where Self.isTransient(response):
            return UbiquityError(store: .unreachable, "store \(location) keeps failing: \(status) \(code)\(message) (\(attempts) tries of \(what))")
        default:
            return UbiquityError(EIO, "store \(location): \(what) failed: \(response.status) \(code)\(message)")
        }
    }

    static func describe(_ error: any Error) -> String {
        if let error = error as? UbiquityError { return error.message }
        let text = String(describing: error)
        if text.contains("Connection refused") { return "connection refused" }
        if let error = error as? HTTPClientError { return "\(error)" }
        return text
    }
}
