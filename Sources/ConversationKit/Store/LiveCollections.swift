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
}

/// A conversation's messages, oldest first, as they stand now.
public struct MessagesSnapshot: Sendable {
    public let messages: [Message]
    /// Whether older messages than the first one are left to load (``LiveMessages/loadOlder()``).
    public let hasOlder: Bool
    /// Against the snapshot before (everything inserted in the first).
    public let changes: CollectionChanges<MessageID>
}

/// The conversations by last activity, newest first, as they stand now.
public struct ConversationsSnapshot: Sendable {
    public let conversations: [Conversation]
    public let changes: CollectionChanges<String>
}

/// A conversation's messages as a live, paged collection (Amity's LiveCollection, GRDB's
/// `ValueObservation`): the newest page first, older pages on demand, and a new snapshot each
/// time a change the store applies (a sync, a local send) touches one of them — read alone, by
/// its key, never the page again. ``rowsRead`` counts what it read.
public final class LiveMessages: Sendable {
    /// One snapshot now, then one per change; ends when the collection is released.
    public let snapshots: AsyncStream<MessagesSnapshot>
    private let continuation: AsyncStream<MessagesSnapshot>.Continuation
    private let store: ConversationStore
    private let conversation: String, pageSize: Int, includeDeleted: Bool
    private let state: Mutex<(messages: [Message], hasOlder: Bool)>
    private let rows = Atomic<Int>(0)
    private let task = Mutex<Task<Void, Never>?>(nil)

    /// Message rows read so far: the first page, each older page, and one per change.
    public var rowsRead: Int { rows.load(ordering: .relaxed) }

    init(store: ConversationStore, conversation: String, pageSize: Int, includeDeleted: Bool) throws(ConversationError) {
        self.store = store
        self.conversation = conversation
        self.pageSize = pageSize
        self.includeDeleted = includeDeleted
        (snapshots, continuation) = AsyncStream.makeStream(bufferingPolicy: .unbounded)
        // Subscribed before the page is read: a change in between is applied again (idempotent).
        let events = store.events()
        let page = try store.messages(in: conversation, limit: pageSize, includeDeleted: includeDeleted)
        rows.add(page.messages.count, ordering: .relaxed)
        state = Mutex((page.messages, page.olderCursor != nil))
        continuation.yield(MessagesSnapshot(messages: page.messages, hasOlder: page.olderCursor != nil,
                                            changes: CollectionChanges(inserted: page.messages.map(\.id))))
        task.withLock {
            $0 = following(events, self) { live, event in
                switch event {
                case .messageAdded(let id), .messageChanged(let id), .syncStateChanged(let id):
                    if id.conversation == live.conversation { live.refresh(id) }
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
        let page = try store.messages(in: conversation, limit: pageSize, before: MessageCursor(spokenAt: ConversationStore.milliseconds(oldest.spokenAt), name: oldest.id.name),
                                      includeDeleted: includeDeleted)
        rows.add(page.messages.count, ordering: .relaxed)
        state.withLock { state in
            let held = Set(state.messages.map(\.id))
            let older = page.messages.filter { !held.contains($0.id) && Self.precedes($0, state.messages.first) }
            state.messages.insert(contentsOf: older, at: 0)
            state.hasOlder = page.olderCursor != nil
            continuation.yield(MessagesSnapshot(messages: state.messages, hasOlder: state.hasOlder, changes: CollectionChanges(inserted: older.map(\.id))))
        }
    }

    /// One message changed: read it alone and put it in (or take it out of) the window.
    private func refresh(_ id: MessageID) {
        let row = try? store.messageRow(id)
        rows.add(1, ordering: .relaxed)
        let current = (row ?? nil).flatMap { includeDeleted || !$0.isDeleted ? $0 : nil }
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
            continuation.yield(MessagesSnapshot(messages: state.messages, hasOlder: state.hasOlder, changes: changes))
        }
    }

    /// The page order: by time, then name.
    static func precedes(_ a: Message, _ b: Message?) -> Bool {
        guard let b else { return true }
        return (a.spokenAt, a.id.name) < (b.spokenAt, b.id.name)
    }
}

/// The conversations (not archived) as a live collection, in ``Conversation/listOrder(_:_:)``: a
/// snapshot each time a change touches one (a message, a read, a rename, a pin), that
/// conversation read alone; one archived leaves it. ``rowsRead`` counts what it read.
public final class LiveConversations: Sendable {
    public let snapshots: AsyncStream<ConversationsSnapshot>
    private let continuation: AsyncStream<ConversationsSnapshot>.Continuation
    private let store: ConversationStore
    private let state: Mutex<[Conversation]>
    private let rows = Atomic<Int>(0)
    private let task = Mutex<Task<Void, Never>?>(nil)

    public var rowsRead: Int { rows.load(ordering: .relaxed) }

    init(store: ConversationStore) throws(ConversationError) {
        self.store = store
        (snapshots, continuation) = AsyncStream.makeStream(bufferingPolicy: .unbounded)
        let events = store.events()
        let all = try store.conversations()
        rows.add(all.count, ordering: .relaxed)
        state = Mutex(all)
        continuation.yield(ConversationsSnapshot(conversations: all, changes: CollectionChanges(inserted: all.map(\.id))))
        task.withLock {
            $0 = following(events, self) { live, event in
                switch event {
                case .messageAdded(let id), .messageChanged(let id), .syncStateChanged(let id): live.refresh(id.conversation)
                case .conversationChanged(let zone): live.refresh(zone)
                default: break
                }
            }
        }
    }

    deinit {
        task.withLock { $0?.cancel() }
        continuation.finish()
    }

    private func refresh(_ zone: String) {
        let current = ((try? store.conversationRow(zone)) ?? nil).flatMap { $0.isArchived ? nil : $0 }
        rows.add(1, ordering: .relaxed)
        state.withLock { list in
            var changes = CollectionChanges<String>()
            if let index = list.firstIndex(where: { $0.id == zone }) {
                guard list[index] != current else { return }
                list.remove(at: index)
                if current == nil { changes.removed = [zone] } else { changes.updated = [zone] }
            } else if current != nil {
                changes.inserted = [zone]
            }
            if let current {
                let at = list.firstIndex { Conversation.listOrder(current, $0) } ?? list.endIndex
                list.insert(current, at: at)
            }
            guard !changes.isEmpty else { return }
            continuation.yield(ConversationsSnapshot(conversations: list, changes: changes))
        }
    }
}

/// A task handing each store event to `owner` for as long as it lives (a live collection ends
/// its task when it is released).
private func following<Owner: AnyObject & Sendable>(_ events: AsyncStream<StoreEvent>, _ owner: Owner,
                                                   _ handle: @escaping @Sendable (Owner, StoreEvent) -> Void) -> Task<Void, Never> {
    Task { [weak owner] in
        for await event in events {
            guard let owner else { return }
            handle(owner, event)
        }
    }
}

extension ConversationStore {
    /// A conversation's messages as a live collection: the newest `pageSize`, older pages by
    /// ``LiveMessages/loadOlder()``, kept up to date one message at a time.
    /// - Parameter includeDeleted: with deleted messages' placeholders (``Message/isDeleted``).
    public func liveMessages(in conversation: String, pageSize: Int = 50, includeDeleted: Bool = true) throws(ConversationError) -> LiveMessages {
        try LiveMessages(store: self, conversation: conversation, pageSize: max(1, min(pageSize, 1000)), includeDeleted: includeDeleted)
    }

    /// The conversations by last activity as a live collection, kept up to date one
    /// conversation at a time.
    public func liveConversations() throws(ConversationError) -> LiveConversations {
        try LiveConversations(store: self)
    }

    /// A group's members now and after every change to the group (re-read whole: membership
    /// changes are rare next to messages).
    public func observeMembers(of group: String) -> AsyncStream<[GroupMember]> {
        let events = self.events()
        return AsyncStream { continuation in
            let task = Task {
                if let members = try? members(of: group) { continuation.yield(members) }
                for await event in events {
                    guard case .conversationChanged(group) = event, let members = try? members(of: group) else { continue }
                    continuation.yield(members)
                }
                continuation.finish()
            }
            continuation.onTermination = { _ in task.cancel() }
        }
    }

    /// One message row, deleted or not; nil when the store does not show it.
    func messageRow(_ id: MessageID) throws(ConversationError) -> Message? {
        try read { db in try db.first("SELECT \(Self.messageColumns) FROM messages WHERE zone = ? AND name = ?", [id.conversation, id.name], Self.message(from:)) }
    }

    /// One conversation, as ``conversations()`` lists it; nil when there is none.
    func conversationRow(_ zone: String) throws(ConversationError) -> Conversation? {
        let local = try requireIdentity()
        return try read { db in try Self.conversations(db, where: "c.zone = ?", [zone], local: local.identifier).first }
    }
}
