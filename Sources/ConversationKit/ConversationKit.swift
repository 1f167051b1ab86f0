/// ConversationKit: the chat store (Speakers, Conversations, Messages) on a local SQLite cache,
/// synced through a ``RecordZone`` backend. Filled by the chat-store issue.
public enum ConversationKitInfo {
    public static let version = "0.1.0"
}
