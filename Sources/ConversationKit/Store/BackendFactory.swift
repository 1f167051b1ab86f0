import Foundation
import ImageKit
import RecordZone
import SQLiteKit

/// What a store hands its backend when it connects: its own ``RecordPolicy`` (with the keys it
/// has pinned, so every record it pulls is verified by the store's rules) and the local
/// speaker's identity and key (a server authenticates requests with them).
public struct BackendContext: Sendable {
    public let policy: RecordPolicy
    public let identity: String
    /// The key this device signs with: the identity key on the first device, a device key on a
    /// linked one.
    public let key: SigningKey
    /// On a linked device, its certificate (``DeviceCertificate``, canonical bytes).
    public let deviceCertificate: Data?
    /// A directory of the store's own for the backend's local state (a folder writer's device
    /// ID, lock and sequence counters, the ID of the folder it writes to).
    public let stateDirectory: String
}

/// How a store reaches its backend. The store connects on first use, once its local speaker
/// is set up.
public struct BackendFactory: Sendable {
    let make: @Sendable (BackendContext) throws(RecordZoneError) -> any RecordZoneBackend

    /// Any backend, built from the store's context.
    public static func custom(_ make: @escaping @Sendable (BackendContext) throws(RecordZoneError) -> any RecordZoneBackend) -> BackendFactory {
        BackendFactory(make: make)
    }

    /// A shared folder (``FileSystemBackend``), written under the label `device`. The store
    /// remembers the folder: once it has synced, a folder that is missing, empty (not mounted?)
    /// or another one is `folderUnavailable`, and nothing is written.
    public static func folder(_ root: String, device: String) -> BackendFactory {
        folder(root, device: device, observingWhileInUse: false)
    }

    /// A shared folder written as `device`; with `observingWhileInUse`, while another process
    /// writes as this store's device (a running `convkitd sync` on the same store), this one
    /// reads the folder as an observer instead of failing with `deviceInUse`: its pulls and
    /// queries work, and its local changes wait in the outbox for that process to push (it
    /// looks at the outbox every poll). How the CLI works beside the daemon.
    public static func folder(_ root: String, device: String, observingWhileInUse: Bool) -> BackendFactory {
        BackendFactory { context throws(RecordZoneError) in
            do throws(RecordZoneError) {
                return try FileSystemBackend(root: root, device: device, policy: context.policy, stateDirectory: context.stateDirectory + "/folder")
            } catch {
                guard observingWhileInUse, error.code == .deviceInUse else { throw error }
                return try FileSystemBackend(root: root, device: nil, policy: context.policy)
            }
        }
    }

    /// A shared folder read without writing (an observer): the store pulls what others wrote,
    /// and every push is refused (`notAuthorized`), its messages left pending. Nothing is ever
    /// written into the folder, not even a new one.
    public static func folderObserver(_ root: String) -> BackendFactory {
        BackendFactory { context throws(RecordZoneError) in try FileSystemBackend(root: root, device: nil, policy: context.policy) }
    }

    /// A zone server (`convkitd serve`) at `url`, e.g. `http://127.0.0.1:8080`.
    public static func server(_ url: URL) -> BackendFactory {
        BackendFactory { context in HTTPBackend(url: url, identity: context.identity, key: context.key, policy: context.policy, deviceCertificate: context.deviceCertificate) }
    }

    /// A connection to an in-memory backend shared with other stores (tests, previews).
    public static func memory(_ backend: InMemoryBackend) -> BackendFactory {
        BackendFactory { context in backend.connection(policy: context.policy) }
    }
}

/// Tunables of a store, with defaults for production; tests inject the clock and randomness.
/// When a store downloads other speakers' avatars.
public enum AvatarDownload: Sendable, Hashable {
    /// Every sync fetches the avatars it does not hold yet.
    case duringSync
    /// Only when ``ConversationStore/avatarImage(for:)`` asks for one.
    case onFirstAccess
}

public struct StoreConfiguration: Sendable {
    /// Records per pulled page.
    public var pageSize = 200
    /// How far ahead of this machine's wall clock another's clock may be before it is flagged
    /// (seconds): a received clock is observed only up to it, and a link code is accepted up to
    /// this long past its expiry (the skew a zone server allows requests, too).
    public var clockSkewTolerance = 300.0
    /// Records per pushed batch (at most ``Record/maximumBatchSize``).
    public var pushBatchSize = Record.maximumBatchSize
    /// First retry delay after a transient push failure; doubles per attempt, with jitter.
    public var retryBaseDelay = 0.5
    public var retryMaximumDelay = 300.0
    /// The wall clock (retry scheduling, message times).
    public var now: @Sendable () -> Date = { Date() }
    /// A uniform random number in 0..<1 for retry jitter.
    public var random: @Sendable () -> Double = { Double.random(in: 0..<1) }
    /// The version clock; defaults to one driven by ``now``.
    public var clock: HybridLogicalClock?
    /// The box avatars are scaled down to fit (default 100×100, ``Speaker/maxImageSize``).
    public var maxImageSize = Speaker.maxImageSize
    /// Limits on images given to ``ConversationStore/setAvatar(imageData:)``: bytes (default
    /// 20 MiB) and pixels (default 25 million), checked before any pixel is decoded.
    public var imageLimits = ImageLimits()
    /// The bytes the image cache (`Images/`) may hold before the least recently used images
    /// go (default 50 MiB); the local speaker's own avatar is never evicted.
    public var imageCacheBytes = 50 << 20
    /// When other speakers' avatars are downloaded: during ``ConversationStore/sync()``
    /// (default) or on first access (``ConversationStore/avatarImage(for:)``).
    public var avatarDownload = AvatarDownload.duringSync
    /// When other speakers' files are downloaded: on demand (default,
    /// ``ConversationStore/downloadFile(of:progress:)``) or during the sync up to a size.
    public var fileDownload = FileDownload.onDemand
    /// The bytes the file cache (`Files/`) may hold before the least recently used files go
    /// (default 1 GiB), as the image cache's budget; a file of the local speaker's own that is
    /// not wholly uploaded is never evicted.
    public var fileCacheBytes = 1 << 30
    /// Whether ``ConversationStore/run(pollInterval:longPolls:)`` tells the backend this person is
    /// online while it runs (default: yes; WhatsApp's "last seen: nobody" is false). Over a
    /// folder nothing is said either way.
    public var sharesPresence = true
    /// Where the store says what it does (sync rounds, refusals, backoffs): silent by default
    /// (ConversationKit's `feedbackLevel`). `Logger(label: "chat", level: .info)` writes one
    /// line per entry to stderr.
    public var logger = Logger.silent

    public init() {}
}
