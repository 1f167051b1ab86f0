import Foundation
import Synchronization

/// The keys a reader holds for identities: one ``KeyChain`` each (identity key, retired keys,
/// devices, revocations), pinned on first use or verified, and the identities held in conflict.
/// The half of a ``RecordPolicy`` that grows as records are admitted; ``PinTable`` keeps it, one
/// row per identity, written in the transaction that stores the records that changed it.
public final class KeyPins: Sendable {
    struct State {
        var chains: [String: KeyChain]
        var changed = Set<String>()
        /// Unpinned identities seen with unrelated keys: nothing is pinned for them on first use
        /// until ``KeyPins/pinVerified(_:for:)`` settles them.
        var conflicted = Set<String>()
        /// Moves with every change to a chain (``KeyPins/generation``).
        var generation: UInt64 = 0

        /// Replaces an identity's chain and marks it changed.
        mutating func set(_ chain: KeyChain, for identity: String) {
            chains[identity] = chain
            changed.insert(identity)
            generation &+= 1
        }
    }
    private let state: Mutex<State>

    public init(_ chains: [String: KeyChain] = [:]) {
        state = Mutex(State(chains: chains))
    }

    /// A number that moves whenever a chain is added or changed: what a cache decided from
    /// the chains stays true while it holds.
    public var generation: UInt64 { state.withLock { $0.generation } }

    /// The chains and conflicts as they stand (copy-on-write: nothing is copied until changed),
    /// for an admission that decides into a draft.
    func snapshot() -> (chains: [String: KeyChain], conflicted: Set<String>) {
        state.withLock { ($0.chains, $0.conflicted) }
    }

    /// Makes what an admission decided the shared state, once what it decided for is stored
    /// (after the commit). Each chain is merged into the one held (``KeyChain/merging(_:)``),
    /// so two saves that each added a device to one identity both keep theirs.
    /// - Parameter markChanged: whether the chains are also left for the next
    ///   ``takeChangedChains()`` (a reader that persists what it admitted later, with its records).
    public func publish(_ changes: PinChanges, markChanged: Bool = false) {
        guard !changes.isEmpty else { return }
        state.withLock { state in
            for (identity, chain) in changes.chains {
                state.chains[identity] = state.chains[identity].map { $0.merging(chain) } ?? chain
                if markChanged { state.changed.insert(identity) }
            }
            state.conflicted.formUnion(changes.conflicted)
            state.generation &+= 1
            for identity in changes.chains.keys where state.chains[identity]?.isVerified == true { state.conflicted.remove(identity) }
        }
    }

    /// The chain pinned for one identity.
    public func chain(for identity: String) -> KeyChain? { state.withLock { $0.chains[identity] } }

    /// The identities with a chain, in order after `after`, at most `limit` (an operator's list).
    public func identities(after: String?, limit: Int) -> [String] {
        let names = state.withLock { state in state.chains.keys.filter { name in after.map { name > $0 } ?? true } }
        return Array(names.sorted().prefix(limit))
    }

    /// The chains added or changed since the last call. Persist them in the transaction that
    /// stores the records that made them; on failure, hand them back with ``restoreChangedChains(_:)``.
    public func takeChangedChains() -> [String: KeyChain] {
        state.withLock { state in
            defer { state.changed.removeAll() }
            return Dictionary(uniqueKeysWithValues: state.changed.compactMap { id in state.chains[id].map { (id, $0) } })
        }
    }

    /// The identities whose chains changed since the last ``takeChangedChains()``.
    public var changedIdentities: Set<String> { state.withLock { $0.changed } }

    /// Marks chains as changed again (their transaction did not commit).
    public func restoreChangedChains(_ chains: [String: KeyChain]) {
        state.withLock { $0.changed.formUnion(chains.keys) }
    }

    /// Installs chains read back from storage (whole: retired keys stay valid for what they signed).
    public func install(_ chains: [String: KeyChain]) {
        state.withLock { state in
            state.chains.merge(chains) { _, stored in stored }
            state.generation &+= 1
        }
    }

    /// Whether `key` speaks for `identity` now: the chain's current key or a certified device
    /// not revoked, or nothing is pinned yet and `key` is pinned now (trust on first use).
    public func bind(identity: String, key: Data) -> Bool {
        state.withLock { state in
            if let chain = state.chains[identity] { return chain.allowsNow(key) }
            state.set(KeyChain(current: key), for: identity)
            return true
        }
    }

    /// Pins `key` for `identity` as verified (a ref carried it, or the app compared its
    /// fingerprint). - Returns: false when another key is pinned: a pin never switches silently.
    public func pinVerified(_ key: Data, for identity: String) -> Bool {
        state.withLock { state in
            var chain = state.chains[identity] ?? KeyChain(current: key)
            guard chain.current == key else { return false }
            if chain.isVerified { return true }
            chain.isVerified = true
            state.set(chain, for: identity)
            state.conflicted.remove(identity)
            return true
        }
    }

    /// Settles a conflict that what was held back resolves by itself: pins `key` for `identity`
    /// on first use (unverified), as if the records had been read in another order, and takes
    /// it out of conflict. - Returns: false when a chain is pinned already or it is not in conflict.
    public func resolveConflict(_ identity: String, key: Data) -> Bool {
        state.withLock { state in
            guard state.chains[identity] == nil, state.conflicted.contains(identity) else { return false }
            state.set(KeyChain(current: key), for: identity)
            state.conflicted.remove(identity)
            return true
        }
    }

    /// Identities held in conflict (no pin, claimed with unrelated keys), as read or as restored
    /// from storage.
    public var conflictedIdentities: Set<String> { state.withLock { $0.conflicted } }

    /// Holds identities in conflict again after a restart.
    public func markConflicted(_ identities: some Sequence<String>) {
        state.withLock { $0.conflicted.formUnion(identities) }
    }

    /// Whether `key` is a device of `identity` that has been revoked (a backend refuses anything
    /// such a device saves, whatever clock it claims).
    public func isRevokedDevice(_ key: Data, of identity: String) -> Bool {
        state.withLock { $0.chains[identity]?.device(key)?.revokedAfter != nil }
    }
}

/// What an admission would change in the pins, as a value: the whole new chain of each identity
/// it changed, and the identities it found claimed with unrelated keys. Whoever stores the
/// records stores exactly these chains in the same transaction (``PinTable/save(_:in:)``), then
/// publishes them (``KeyPins/publish(_:markChanged:)``).
public struct PinChanges: Sendable, Hashable {
    public var chains: [String: KeyChain] = [:]
    public var conflicted: Set<String> = []

    public init(chains: [String: KeyChain] = [:], conflicted: Set<String> = []) {
        self.chains = chains
        self.conflicted = conflicted
    }

    public var isEmpty: Bool { chains.isEmpty && conflicted.isEmpty }
}

/// An admission's working copy of the pins: reads fall through to the snapshot it started
/// from, writes stay in ``changes``.
struct PinDraft {
    let base: [String: KeyChain]
    let baseConflicted: Set<String>
    var changes = PinChanges()

    init(_ pins: KeyPins) {
        (base, baseConflicted) = pins.snapshot()
    }

    func chain(_ identity: String) -> KeyChain? { changes.chains[identity] ?? base[identity] }

    func isConflicted(_ identity: String) -> Bool { changes.conflicted.contains(identity) || baseConflicted.contains(identity) }

    mutating func set(_ chain: KeyChain, for identity: String) { changes.chains[identity] = chain }
}
