import Foundation

/// What `convkit init` (or `device join`) chose for a store, in `<store>/convkit.json` (0600):
/// the backend it syncs through and its speaker. `convkit` and `convkitd sync` read it when their
/// options name no backend.
public struct StoreSettings: Codable, Sendable {
    public var server: String?
    public var zoneDir: String?
    public var device: String?
    /// The store's speaker, for `convkit doctor --rebuild` when the database cannot be read.
    public var identity: String?

    public init() {}

    public static func path(inStore store: String) -> String { store + "/convkit.json" }

    /// The store's settings; none when the file is missing or unreadable.
    public static func load(fromStore store: String) -> StoreSettings {
        guard let data = FileManager.default.contents(atPath: path(inStore: store)),
            let settings = try? JSONDecoder().decode(StoreSettings.self, from: data)
        else { return StoreSettings() }
        return settings
    }
}
