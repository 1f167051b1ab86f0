import Foundation
import RecordZone
import SQLiteKit

/// A person's own housekeeping of their conversations, on this device: archive, mute, pin,
/// mark unread, drafts. Kept in the store, never synced (nothing reaches the backend: not even
/// the person's other devices learn of it), each change a ``StoreEvent/conversationChanged(_:)``.
/// Deleting locally is ``removeConversation(with:)``.
extension ConversationStore {
    /// Archives a conversation (or brings it back): it leaves ``conversations(includeArchived:)``
    /// and the live list, and stays archived when messages arrive (WhatsApp's rule).
    public func archive(_ conversation: String, _ archived: Bool = true) async throws(ConversationError) {
        try await setting(conversation, "is_archived", archived)
    }

    /// Mutes a conversation until a time (``Date/distantFuture``: until unmuted), or unmutes it
    /// (nil): ``Conversation/isMuted(at:)``, for an app to decide what not to notify.
    public func mute(_ conversation: String, until: Date?) async throws(ConversationError) {
        try await setting(conversation, "muted_until", until.map { Self.milliseconds(min($0, Date(timeIntervalSince1970: 9e12))) })
    }

    /// Pins a conversation (first in the list, in pinning order), or unpins it.
    public func pin(_ conversation: String, _ pinned: Bool = true) async throws(ConversationError) {
        try await setting(conversation, "pinned_at", pinned ? Self.milliseconds(configuration.now()) : nil)
    }

    /// Marks a conversation unread (``Conversation/isMarkedUnread``) until its messages are
    /// marked read (``markAllAsRead(in:)``); no receipt changes.
    public func markUnread(_ conversation: String) async throws(ConversationError) {
        try await setting(conversation, "is_marked_unread", true)
    }

    /// Keeps what was typed and not sent (nil or empty clears it); a send clears it.
    /// - Throws: ``ConversationError/Code/contentTooLarge`` over a message's 64 KiB.
    public func setDraft(_ text: String?, in conversation: String) async throws(ConversationError) {
        let text = text.flatMap { $0.isEmpty ? nil : $0 }
        if let text, text.utf8.count > Message.maximumContentBytes {
            throw ConversationError(.contentTooLarge, "a draft is at most \(Message.maximumContentBytes) bytes, as a message")
        }
        try await setting(conversation, "draft", text)
    }

    private func setting<Value: DatabaseValueConvertible & Sendable>(_ conversation: String, _ column: String, _ value: Value?) async throws(ConversationError) {
        try await write { applier in
            try Self.requireConversation(applier.db, conversation)
            try Self.updateSetting(conversation, column, value, in: applier.db)
            applier.note(.conversationChanged(conversation))
        }
    }

    static func updateSetting<Value: DatabaseValueConvertible>(_ zone: String, _ column: String, _ value: Value?, in db: Database) throws {
        try db.execute("INSERT INTO conversation_settings (zone) VALUES (?) ON CONFLICT (zone) DO NOTHING", [zone])
        try db.execute("UPDATE conversation_settings SET \(column) = ? WHERE zone = ?", [value, zone])
    }
}
