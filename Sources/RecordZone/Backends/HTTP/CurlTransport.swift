import CCurl
import Foundation
import Synchronization

/// One HTTP request, as ``CurlTransport`` sends it.
struct HTTPExchange: Sendable {
    var method: String
    var url: String
    var headers: [(String, String)]
    var body: Data
    /// Seconds for the whole transfer, connection included.
    var timeout: Double
    /// Seconds to connect.
    var connectTimeout: Double = 10
    /// A PEM file of CA certificates for HTTPS (nil: the system's store).
    var caFile: String?
    /// The largest answer body accepted.
    var maximumResponseBytes = 256 << 20
}

/// One HTTP answer: status, headers (lowercased names), body.
struct HTTPAnswer: Sendable {
    var status: Int
    var headers: [String: String]
    var body: Data
}

/// HTTP on libcurl. One thread drives every transfer of the process through one multi handle:
/// keep-alive connections are reused per host (up to 8 at once per host), HTTP/2 is used where
/// TLS offers it, a transfer that waits — a long poll — holds no thread, and cancelling the
/// task that waits for a transfer aborts it.
final class CurlTransport: @unchecked Sendable {
    static let shared = CurlTransport()

    /// The multi handle; touched only on the loop thread, except `curl_multi_wakeup` (thread-safe).
    private let multi: UnsafeMutableRawPointer
    private let incoming = Mutex<[Transfer]>([])
    /// Transfers in the multi handle, by easy handle: loop thread only.
    private var live: [UnsafeMutableRawPointer: Transfer] = [:]

    private init() {
        curl_global_init(Int(CURL_GLOBAL_DEFAULT))
        guard let multi = curl_multi_init() else { preconditionFailure("curl_multi_init failed: out of memory") }
        self.multi = multi
        ck_multi_setopt_long(multi, CURLMOPT_MAX_HOST_CONNECTIONS, 8)
        ck_multi_setopt_long(multi, CURLMOPT_MAXCONNECTS, 64)
        ck_multi_setopt_long(multi, CURLMOPT_PIPELINING, Int(CURLPIPE_MULTIPLEX))
        let thread = Thread { [unowned self] in self.run() }
        thread.name = "convkit-curl"
        thread.start()
    }

    /// Sends a request and waits for its answer without holding a thread.
    /// - Throws: ``RecordZoneError/Code/networkUnavailable`` when the transfer fails (refused,
    ///   reset, timed out, TLS), or is cancelled.
    func perform(_ exchange: HTTPExchange) async throws(RecordZoneError) -> HTTPAnswer {
        let transfer = try Transfer(exchange)
        let outcome = await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                transfer.continuation = continuation
                incoming.withLock { $0.append(transfer) }
                curl_multi_wakeup(multi)
            }
        } onCancel: {
            transfer.cancelRequested.store(true, ordering: .relaxed)
            curl_multi_wakeup(multi)
        }
        return try outcome.get()
    }

    private func run() {
        var running: Int32 = 0
        var left: Int32 = 0
        while true {
            for transfer in incoming.withLock({ pending in defer { pending.removeAll() }; return pending }) {
                live[transfer.handle] = transfer
                curl_multi_add_handle(multi, transfer.handle)
            }
            for (handle, transfer) in live where transfer.cancelRequested.load(ordering: .relaxed) {
                finish(handle, transfer, .failure(RecordZoneError(.networkUnavailable, "\(transfer.what): cancelled")))
            }
            curl_multi_perform(multi, &running)
            while let message = curl_multi_info_read(multi, &left) {
                guard message.pointee.msg == CURLMSG_DONE, let handle = message.pointee.easy_handle, let transfer = live[handle] else { continue }
                finish(handle, transfer, transfer.answer(message.pointee.data.result))
            }
            curl_multi_poll(multi, nil, 0, 1000, nil)
        }
    }

    private func finish(_ handle: UnsafeMutableRawPointer, _ transfer: Transfer, _ outcome: Result<HTTPAnswer, RecordZoneError>) {
        curl_multi_remove_handle(multi, handle)
        live[handle] = nil
        transfer.complete(outcome)
    }
}

/// One transfer's handle, buffers and waiting task. Built on the caller's thread, then touched
/// only by the loop thread (the callbacks run there too).
private final class Transfer: @unchecked Sendable {
    let handle: UnsafeMutableRawPointer
    let what: String
    let cancelRequested = Atomic<Bool>(false)
    var continuation: CheckedContinuation<Result<HTTPAnswer, RecordZoneError>, Never>?
    private var headerList: UnsafeMutablePointer<curl_slist>?
    private let requestBody: UnsafeMutableRawBufferPointer
    private let maximumResponseBytes: Int
    private(set) var body = Data()
    private(set) var headers = [String: String]()
    private(set) var tooLarge = false

    init(_ exchange: HTTPExchange) throws(RecordZoneError) {
        guard let handle = curl_easy_init() else { throw RecordZoneError(.internalError, "curl_easy_init failed") }
        self.handle = handle
        what = "\(exchange.method) \(exchange.url)"
        maximumResponseBytes = exchange.maximumResponseBytes
        requestBody = UnsafeMutableRawBufferPointer.allocate(byteCount: max(1, exchange.body.count), alignment: 1)
        exchange.body.copyBytes(to: requestBody)

        ck_setopt_string(handle, CURLOPT_URL, exchange.url)
        ck_setopt_long(handle, CURLOPT_NOSIGNAL, 1)
        ck_setopt_long(handle, CURLOPT_HTTP_VERSION, Int(CURL_HTTP_VERSION_2TLS))
        ck_setopt_long(handle, CURLOPT_TIMEOUT_MS, Int(exchange.timeout * 1000))
        ck_setopt_long(handle, CURLOPT_CONNECTTIMEOUT_MS, Int(exchange.connectTimeout * 1000))
        if let caFile = exchange.caFile { ck_setopt_string(handle, CURLOPT_CAINFO, caFile) }
        switch exchange.method {
        case "GET": ck_setopt_long(handle, CURLOPT_HTTPGET, 1)
        case "POST": break
        default: ck_setopt_string(handle, CURLOPT_CUSTOMREQUEST, exchange.method)
        }
        if exchange.method != "GET" {
            ck_setopt_pointer(handle, CURLOPT_POSTFIELDS, requestBody.baseAddress)
            ck_setopt_offset(handle, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(exchange.body.count))
        }
        // No "Expect: 100-continue" round trip before a large body.
        for (name, value) in exchange.headers + [("Expect", "")] {
            headerList = curl_slist_append(headerList, "\(name): \(value)")
        }
        ck_setopt_pointer(handle, CURLOPT_HTTPHEADER, UnsafeMutableRawPointer(headerList))
        let me = Unmanaged.passUnretained(self).toOpaque()
        ck_setopt_callback(handle, CURLOPT_WRITEFUNCTION, Transfer.write)
        ck_setopt_pointer(handle, CURLOPT_WRITEDATA, me)
        ck_setopt_callback(handle, CURLOPT_HEADERFUNCTION, Transfer.header)
        ck_setopt_pointer(handle, CURLOPT_HEADERDATA, me)
    }

    deinit {
        curl_easy_cleanup(handle)
        curl_slist_free_all(headerList)
        requestBody.deallocate()
    }

    func answer(_ code: CURLcode) -> Result<HTTPAnswer, RecordZoneError> {
        if tooLarge { return .failure(RecordZoneError(.limitExceeded, "\(what): the answer is over \(maximumResponseBytes) bytes")) }
        guard code == CURLE_OK else {
            var error = RecordZoneError(.networkUnavailable, "\(what): \(String(cString: curl_easy_strerror(code)))")
            // A kept-alive connection the server closed as the request went out (its idle
            // timeout): nothing was answered, and the request may be sent again at once on a
            // new connection (``HTTPBackend`` does, once).
            var connects = 0
            ck_getinfo_long(handle, CURLINFO_NUM_CONNECTS, &connects)
            if code == CURLE_GOT_NOTHING, connects == 0 { error.retryAfter = 0 }
            return .failure(error)
        }
        var status = 0
        ck_getinfo_long(handle, CURLINFO_RESPONSE_CODE, &status)
        return .success(HTTPAnswer(status: status, headers: headers, body: body))
    }

    func complete(_ outcome: Result<HTTPAnswer, RecordZoneError>) {
        continuation?.resume(returning: outcome)
        continuation = nil
    }

    private static let write: ck_data_callback = { data, size, count, user in
        guard let data, let user else { return 0 }
        let transfer = Unmanaged<Transfer>.fromOpaque(user).takeUnretainedValue()
        let n = size * count
        guard transfer.body.count + n <= transfer.maximumResponseBytes else {
            transfer.tooLarge = true
            return 0  // aborts the transfer
        }
        transfer.body.append(UnsafeRawPointer(data).assumingMemoryBound(to: UInt8.self), count: n)
        return n
    }

    private static let header: ck_data_callback = { data, size, count, user in
        guard let data, let user else { return 0 }
        let transfer = Unmanaged<Transfer>.fromOpaque(user).takeUnretainedValue()
        let n = size * count
        let line = String(decoding: UnsafeRawBufferPointer(start: data, count: n), as: UTF8.self)
        if line.hasPrefix("HTTP/") {
            transfer.headers.removeAll()  // a new answer (after a 1xx): only the last one counts
        } else if let colon = line.firstIndex(of: ":") {
            transfer.headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespacesAndNewlines)
        }
        return n
    }
}
