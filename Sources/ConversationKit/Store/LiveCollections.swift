import Foundation
import Synchronization
import SQLiteKit

/// What changed from one snapshot of a live collection to the next, by ID (a UI applies it as a
/// diff, or ignores it and shows the snapshot).
public struct CollectionChanges<ID: Hashable & Sendable>: Sendable, Hashable {
    public var inserted: [ID] = []
    public var updated: [ID] = []
    public var removed: [ID] = []
    public var isEmpty: Bool { inserted.isEmpty && updated.isEmpty && removed.isEmpty }

    public init(inserted: [ID] = [], updated: [ID] = [], removed: [ID] = []) {
        self.inserted = inserted
        self.updated = updated
        self.removed = removed
    }

    /// From `old` to `new`, each element told by `id`.
    init<Element: Equatable>(from old: [Element], to new: [Element], id: (Element) -> ID) {
        let before = Dictionary(old.map { (id($0), $0) }, uniquingKeysWith: { first, _ in first })
        let after = Set(new.map(id))
        for element in new {
            let key = id(element)
            if let was = before[key] {
                if was != element { updated.append(key) }
            } else {
                inserted.append(key)
            }
        }
        removed = old.map(id).filter { !after.contains($0) }
    }
}

/// A conversation's messages, oldest first, as they stand now.
public struct MessagesSnapshot: Sendable {
    public let messages: [Message]
    /// Whether older messages than the first one are left to load (``LiveMessages/loadOlder()``).
    public let hasOlder: Bool
    /// Against the snapshot before (everything inserted in the first).
    public let changes: CollectionChanges<MessageID>
    /// A read that failed (the disk, a damaged file): the snapshot keeps everything it showed —
    /// a message is never taken out because it could not be read — and the collection reads its
    /// whole window again at the next change. Nil when the snapshot is what the store holds.
    public let error: ConversationError?
}

/// The conversations by last activity, newest first, as they stand now.
public struct ConversationsSnapshot: Sendable {
    public let conversations: [Conversation]
    public let changes: CollectionChanges<String>
    /// A read that failed, as ``MessagesSnapshot/error``: nothing shown is taken out for it.
    public let error: ConversationError?
}

/// A conversation's messages as a live, paged collection (Amity's LiveCollection, GRDB's
/// `ValueObservation`): the newest page first, older pages on demand, and a new snapshot each
/// time a change the store applies (a sync, a local send) touches one of them — read alone, by
/// its key, never the page again. ``rowsRead`` counts what it read.
///
/// After its first page, its reads never block a thread of the caller's or of the cooperative
/// pool. When it falls behind the store's events (``StoreEvent/reset``) or a read fails, it
/// reads its window again: every message at or after the oldest shown.
public final class LiveMessages: Sendable {
    /// One snapshot now, then one per change; ends when the collection is released.
    public let snapshots: AsyncStream<MessagesSnapshot>
    private let continuation: AsyncStream<MessagesSnapshot>.Continuation
    private let store: ConversationStore
    private let conversation: String, pageSize: Int, includeDeleted: Bool
    private let state: Mutex<Window>
    private let rows = Atomic<Int>(0)
    private let task = Mutex<Task<Void, Never>?>(nil)

    private struct Window {
        var messages: [Message]
        var hasOlder: Bool
        /// A read failed: what is shown may be out of date until the window is read again.
        var isStale = false
    }

    /// Message rows read so far: the first page, each older page, one per change, and the
    /// window each time it is read again.
    public var rowsRead: Int { rows.load(ordering: .relaxed) }

    /// `events` was subscribed before `page` was read: a change in between is applied again
    /// (idempotent).
    init(store: ConversationStore, conversation: String, pageSize: Int, includeDeleted: Bool, events: AsyncStream<StoreEvent>, page: MessagePage) {
        self.store = store
        self.conversation = conversation
        self.pageSize = pageSize
        self.includeDeleted = includeDeleted
        (snapshots, continuation) = AsyncStream.makeStream(bufferingPolicy: .unbounded)
        rows.add(page.messages.count, ordering: .relaxed)
        state = Mutex(Window(messages: page.messages, hasOlder: page.olderCursor != nil))
        continuation.yield(MessagesSnapshot(messages: page.messages, hasOlder: page.olderCursor != nil,
                                            changes: CollectionChanges(inserted: page.messages.map(\.id)), error: nil))
        task.withLock {
            $0 = following(events, self) { live, event in
                switch event {
                case .reset: await live.readWindow()
                case .messageAdded(let id), .messageChanged(let id), .syncStateChanged(let id):
                    if id.conversation == live.conversation { await live.refresh(id) }
                default: break
                }
            }
        }
    }

    deinit {
        task.withLock { $0?.cancel() }
        continuation.finish()
    }

    /// Loads the page of messages before the oldest shown, if any (a snapshot follows).
    public func loadOlder() throws(ConversationError) {
        guard let oldest = state.withLock({ $0.hasOlder ? $0.messages.first : nil }) else { return }
        let page = try store.messages(in: conversation, limit: pageSize, before: Self.cursor(oldest), includeDeleted: includeDeleted)
        rows.add(page.messages.count, ordering: .relaxed)
        state.withLock { state in
            let held = Set(state.messages.map(\.id))
            let older = page.messages.filter { !held.contains($0.id) && Self.precedes($0, state.messages.first) }
            state.messages.insert(contentsOf: older, at: 0)
            state.hasOlder = page.olderCursor != nil
            continuation.yield(MessagesSnapshot(messages: state.messages, hasOlder: state.hasOlder, changes: CollectionChanges(inserted: older.map(\.id)), error: nil))
        }
    }

    /// One message changed: read it alone and put it in (or take it out of) the window.
    private func refresh(_ id: MessageID) async {
        if state.withLock({ $0.isStale }) { return await readWindow() }
        let row: Message?
        do { row = try await store.messageRow(id) } catch { return report(error) }
        rows.add(1, ordering: .relaxed)
        let current = row.flatMap { includeDeleted || !$0.isDeleted ? $0 : nil }
        state.withLock { state in
            var changes = CollectionChanges<MessageID>()
            if let index = state.messages.firstIndex(where: { $0.id == id }) {
                guard state.messages[index] != current else { return }
                state.messages.remove(at: index)
                if current == nil { changes.removed = [id] } else { changes.updated = [id] }
            } else if current != nil {
                changes.inserted = [id]
            }
            if let current {
                // Older than the window while older pages are not loaded: not shown yet.
                if state.hasOlder, let first = state.messages.first, Self.precedes(current, first), changes.updated.isEmpty { return }
                let at = state.messages.firstIndex { Self.precedes(current, $0) } ?? state.messages.endIndex
                state.messages.insert(current, at: at)
            }
            guard !changes.isEmpty else { return }
            continuation.yield(MessagesSnapshot(messages: state.messages, hasOlder: state.hasOlder, changes: changes, error: nil))
        }
    }

    /// Reads the window again — every message at or after the oldest shown (all of them when
    /// no older page is left) — after missed events or a failed read.
    private func readWindow() async {
        let (oldest, hasOlder) = state.withLock { ($0.messages.first, $0.hasOlder) }
        let from = hasOlder ? oldest.map(Self.cursor) : MessageCursor(spokenAt: .min, name: "")
        let page: MessagePage
        do {
            page = try await store.read(ConversationStore.pageQuery(conversation, limit: pageSize, from: from, includeDeleted: includeDeleted))
        } catch {
            return report(error)
        }
        rows.add(page.messages.count, ordering: .relaxed)
        state.withLock { state in
            // Older pages loaded meanwhile stay.
            let kept = oldest.map { oldest in state.messages.prefix { Self.precedes($0, oldest) } } ?? []
            let messages = kept + page.messages
            let changes = CollectionChanges(from: state.messages, to: messages, id: \.id)
            let wasStale = state.isStale
            state = Window(messages: messages, hasOlder: kept.isEmpty ? page.olderCursor != nil : state.hasOlder)
            guard !changes.isEmpty || wasStale else { return }
            continuation.yield(MessagesSnapshot(messages: state.messages, hasOlder: state.hasOlder, changes: changes, error: nil))
        }
    }

    /// A read failed: the window stays as shown, the subscriber learns why, and the next change
    /// reads the window again.
    private func report(_ error: ConversationError) {
        state.withLock { state in
            state.isStale = true
            continuation.yield(MessagesSnapshot(messages: state.messages, hasOlder: state.hasOlder, changes: CollectionChanges(), error: error))
        }
    }

    /// The page order: by time, then name.
    static func precedes(_ a: Message, _ b: Message?) -> Bool {
        guard let b else { return true }
        return (a.spokenAt, a.id.name) < (b.spokenAt, b.id.name)
    }

    static func cursor(_ message: Message) -> MessageCursor {
        MessageCursor(spokenAt: ConversationStore.milliseconds(message.spokenAt), name: message.id.name)
    }
}

/// The conversations (not archived) as a live collection, in ``Conversation/listOrder(_:_:)``: a
/// snapshot each time a change touches one (a message, a read, a rename, a pin), that
/// conversation read alone; one archived leaves it. ``rowsRead`` counts what it read. After
/// missed events (``StoreEvent/reset``) or a failed read it reads the list again.
public final class LiveConversations: Sendable {
    public let snapshots: AsyncStream<ConversationsSnapshot>
    private let continuation: AsyncStream<ConversationsSnapshot>.Continuation
    private let store: ConversationStore
    private let state: Mutex<(list: [Conversation], isStale: Bool)>
    private let rows = Atomic<Int>(0)
    private let task = Mutex<Task<Void, Never>?>(nil)

    public var rowsRead: Int { rows.load(ordering: .relaxed) }

    init(store: ConversationStore, events: AsyncStream<StoreEvent>, all: [Conversation]) {
        self.store = store
        (snapshots, continuation) = AsyncStream.makeStream(bufferingPolicy: .unbounded)
        rows.add(all.count, ordering: .relaxed)
        state = Mutex((all, false))
        continuation.yield(ConversationsSnapshot(conversations: all, changes: CollectionChanges(inserted: all.map(\.id)), error: nil))
        task.withLock {
            $0 = following(events, self) { live, event in
                switch event {
                case .reset: await live.readAll()
                case .messageAdded(let id), .messageChanged(let id), .syncStateChanged(let id): await live.refresh(id.conversation)
                case .conversationChanged(let zone): await live.refresh(zone)
                default: break
                }
            }
        }
    }

    deinit {
        task.withLock { $0?.cancel() }
        continuation.finish()
    }

    private func refresh(_ zone: String) async {
        if state.withLock({ $0.isStale }) { return await readAll() }
        let row: Conversation?
        do { row = try await store.conversationRow(zone) } catch { return report(error) }
        let current = row.flatMap { $0.isArchived ? nil : $0 }
        rows.add(1, ordering: .relaxed)
        state.withLock { state in
            var changes = CollectionChanges<String>()
            if let index = state.list.firstIndex(where: { $0.id == zone }) {
                guard state.list[index] != current else { return }
                state.list.remove(at: index)
                if current == nil { changes.removed = [zone] } else { changes.updated = [zone] }
            } else if current != nil {
                changes.inserted = [zone]
            }
            if let current {
                let at = state.list.firstIndex { Conversation.listOrder(current, $0) } ?? state.list.endIndex
                state.list.insert(current, at: at)
            }
            guard !changes.isEmpty else { return }
            continuation.yield(ConversationsSnapshot(conversations: state.list, changes: changes, error: nil))
        }
    }

    private func readAll() async {
        let all: [Conversation]
        do { all = try await store.loadConversations() } catch { return report(error) }
        rows.add(all.count, ordering: .relaxed)
        state.withLock { state in
            let changes = CollectionChanges(from: state.list, to: all, id: \.id)
            let wasStale = state.isStale
            state = (all, false)
            guard !changes.isEmpty || wasStale else { return }
            continuation.yield(ConversationsSnapshot(conversations: all, changes: changes, error: nil))
        }
    }

    private func report(_ error: ConversationError) {
        state.withLock { state in
            state.isStale = true
            continuation.yield(ConversationsSnapshot(conversations: state.list, changes: CollectionChanges(), error: error))
        }
    }
}

/// A task handing each store event to `owner` for as long as it lives (a live collection ends
/// its task when it is released), one at a time.
private func following<Owner: AnyObject & Sendable>(_ events: AsyncStream<StoreEvent>, _ owner: Owner,
                                                   _ handle: @escaping @Sendable (Owner, StoreEvent) async -> Void) -> Task<Void, Never> {
    Task { [weak owner] in
        for await event in events {
            guard let owner else { return }
            await handle(owner, event)
        }
    }
}

extension ConversationStore {
    /// A conversation's messages as a live collection: the newest `pageSize`, older pages by
    /// ``LiveMessages/loadOlder()``, kept up to date one message at a time.
    /// - Parameter includeDeleted: with deleted messages' placeholders (``Message/isDeleted``).
    public func liveMessages(in conversation: String, pageSize: Int = 50, includeDeleted: Bool = true) throws(ConversationError) -> LiveMessages {
        let events = self.events(), pageSize = max(1, min(pageSize, 1000))
        let page = try messages(in: conversation, limit: pageSize, includeDeleted: includeDeleted)
        return LiveMessages(store: self, conversation: conversation, pageSize: pageSize, includeDeleted: includeDeleted, events: events, page: page)
    }

    /// ``liveMessages(in:pageSize:includeDeleted:)``, its first page read without blocking the
    /// caller's thread.
    func loadLiveMessages(in conversation: String, pageSize: Int, includeDeleted: Bool) async throws(ConversationError) -> LiveMessages {
        let events = self.events(), pageSize = max(1, min(pageSize, 1000))
        let page = try await loadMessages(in: conversation, limit: pageSize, includeDeleted: includeDeleted)
        return LiveMessages(store: self, conversation: conversation, pageSize: pageSize, includeDeleted: includeDeleted, events: events, page: page)
    }

    /// The conversations by last activity as a live collection, kept up to date one
    /// conversation at a time.
    public func liveConversations() throws(ConversationError) -> LiveConversations {
        let events = self.events()
        return LiveConversations(store: self, events: events, all: try conversations())
    }

    /// A group's members now and after every change to the group (re-read whole: membership
    /// changes are rare next to messages).
    public func observeMembers(of group: String) -> AsyncStream<[GroupMember]> {
        let events = self.events()
        return AsyncStream { continuation in
            let task = Task {
                if let members = try? await loadMembers(of: group) { continuation.yield(members) }
                for await event in events {
                    switch event {
                    case .conversationChanged(group), .reset: break
                    default: continue
                    }
                    guard let members = try? await loadMembers(of: group) else { continue }
                    continuation.yield(members)
                }
                continuation.finish()
            }
            continuation.onTermination = { _ in task.cancel() }
        }
    }

    /// One message row, deleted or not; nil when the store does not show it.
    func messageRow(_ id: MessageID) async throws(ConversationError) -> Message? {
        try await read { db in try Self.messages(db, "WHERE zone = ? AND name = ?", [id.conversation, id.name]).first }
    }

    /// One conversation, as ``conversations()`` lists it; nil when there is none.
    func conversationRow(_ zone: String) async throws(ConversationError) -> Conversation? {
        let local = try requireIdentity()
        return try await read { db in try Self.conversations(db, where: "c.zone = ?", [zone], local: local.identifier).first }
    }
}
