import Foundation

/// SIGINT and SIGTERM as a stream (the default action, ending the process, is off); keep the
/// sources while listening.
public func stopSignals() -> (AsyncStream<Int32>, [DispatchSourceSignal]) {
    let (signals, continuation) = AsyncStream<Int32>.makeStream()
    var sources = [DispatchSourceSignal]()
    for number in [SIGINT, SIGTERM] {
        signal(number, SIG_IGN)
        let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
        source.setEventHandler { continuation.yield(number) }
        source.resume()
        sources.append(source)
    }
    return (signals, sources)
}

