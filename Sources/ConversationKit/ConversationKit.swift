public enum ConversationKitVersion { public static let string = "0.1.0" }
