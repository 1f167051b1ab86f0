import ConversationKit
import Foundation
import ToolSupport

/// The group commands: create a group, change who is in it and their roles, list them. A group
/// is named by its id (`g-…`, as `convkit group list` prints it) or by its name when no other
/// group of the store has it. `convkit send` and `convkit messages` take a group the same way.
enum GroupCommands {
    static let group = Positional("group", "The group: its id (g-…) or its name.")

    static let all: [ToolCommand] = [
        ToolCommand(Command("convkit group create", "Create a group, with you as its creator.",
                            options: [.valued("name", "name", "The group's name (required)."), .valued("member", "id", "A speaker to put in it.", repeats: true),
                                      .valued("history", "rule", "What members added later read: since-added (the default: from when they are added) or all (what was said before too). Set once.")]
                                + Targets.storeOptions + [.flag("sync", "Sync right after."), Targets.json]), run: create),
        ToolCommand(Command("convkit group add", "Add speakers to a group (an admin's change).",
                            positionals: [group], options: [.valued("member", "id", "A speaker to add (required).", repeats: true)] + changeOptions),
                    run: { try await change($0) { store, id, arguments in try await store.addMembers(arguments.all("member"), to: id) } }),
        ToolCommand(Command("convkit group remove", "Remove a member or an admin from a group (an admin's change; never the creator).",
                            positionals: [group, Positional("id", "The speaker to remove.")], options: changeOptions),
                    run: { try await change($0) { store, id, arguments in try await store.removeMember(try required(arguments.positional(1), "<id>"), from: id) } }),
        ToolCommand(Command("convkit group leave", "Leave a group.", positionals: [group], options: changeOptions),
                    run: { try await change($0) { store, id, _ in try await store.leave(id) } }),
        ToolCommand(Command("convkit group role", "Make a member an admin, or an admin a member again (an admin's change).",
                            positionals: [group, Positional("id", "The speaker."), Positional("role", "admin or member.")],
                            options: changeOptions),
                    run: { try await change($0) { store, id, arguments in
                        let role: GroupMembership.Role
                        switch arguments.positional(2) {
                        case "admin": role = .admin
                        case "member": role = .member
                        default: throw UsageError("the role is admin or member")
                        }
                        try await store.setRole(role, of: try required(arguments.positional(1), "<id>"), in: id)
                    } }),
        ToolCommand(Command("convkit group rename", "Name a group anew (an admin's change).",
                            positionals: [group, Positional("name", "The new name.")], options: changeOptions),
                    run: { try await change($0) { store, id, arguments in try await store.rename(id, to: try required(arguments.positional(1), "<name>")) } }),
        ToolCommand(Command("convkit group describe", "Set a group's description and picture (an admin's change).",
                            positionals: [group],
                            options: [.valued("description", "text", "The description (empty: none)."), .valued("avatar", "file", "A PNG or JPEG for its picture (capped as avatars are)."),
                                      .flag("remove-avatar", "Take its picture away.")] + changeOptions),
                    run: { try await change($0) { store, id, arguments in
                        let text = arguments.value("description"), file = arguments.value("avatar")
                        guard text != nil || file != nil || arguments.has("remove-avatar") else { throw UsageError("give --description, --avatar or --remove-avatar") }
                        guard file == nil || !arguments.has("remove-avatar") else { throw UsageError("--avatar and --remove-avatar together") }
                        if let text { try await store.setDescription(text, ofGroup: id) }
                        if let file {
                            let data: Data
                            do { data = try Data(contentsOf: URL(fileURLWithPath: file)) } catch { throw ToolFailure("cannot read \(file): \(error.localizedDescription)") }
                            try await store.setAvatar(imageData: data, ofGroup: id)
                        }
                        if arguments.has("remove-avatar") { try await store.removeAvatar(ofGroup: id) }
                    } }),
        ToolCommand(Command("convkit group members", "List a group's members and their roles.", positionals: [group], options: [Targets.store, Targets.json]), run: members),
        ToolCommand(Command("convkit group list", "List your groups.", options: [Targets.store, Targets.json]), run: list),
    ]

    static func required(_ value: String?, _ name: String) throws -> String {
        guard let value else { throw UsageError("missing \(name)") }
        return value
    }

    /// The group a command names: by id, or by a name no other group of the store has.
    static func resolve(_ text: String?, in store: ConversationStore) throws -> Conversation {
        guard let text else { throw UsageError("missing <group>") }
        let groups = try store.conversations(includeArchived: true).filter(\.isGroup)
        if let group = groups.first(where: { $0.id == text }) { return group }
        let named = groups.filter { $0.groupName == text }
        guard named.count <= 1 else { throw ToolFailure("\(named.count) groups are called '\(text)': name one by its id (\(named.map(\.id).joined(separator: ", ")))") }
        guard let group = named.first else { throw ToolFailure("no group '\(text)' in this store ('convkit group list' lists them)") }
        return group
    }

    static func create(_ context: Context) async throws {
        let store = context.arguments.has("sync") ? try context.syncingStore() : try context.store()
        guard let name = context.arguments.value("name") else { throw UsageError("--name is required") }
        let history = try context.arguments.value("history").map { text in
            guard let history = GroupMembership.History(rawValue: text) else { throw UsageError("--history is since-added or all") }
            return history
        } ?? .sinceAdded
        let group = try await store.createGroup(name: name, members: context.arguments.all("member"), history: history)
        if context.arguments.has("sync") { try await store.sync() }
        if context.json { try Output.json(["id": group.id, "name": name]) } else { Output.line(group.id) }
    }

    /// The options of a change to a group.
    static let changeOptions = Targets.storeOptions + [.flag("sync", "Sync right after."),
                                                       .flag("json", "Print the group as the change left it (id, name, members and roles), as JSON.")]

    /// A change to a group: silent when it is made, as Unix tools are; with --json, the group
    /// as it left it.
    static func change(_ context: Context, _ body: (ConversationStore, String, ParsedArguments) async throws -> Void) async throws {
        let store = context.arguments.has("sync") ? try context.syncingStore() : try context.store()
        let group = try resolve(context.arguments.positional(0), in: store)
        try await body(store, group.id, context.arguments)
        if context.arguments.has("sync") { try await store.sync() }
        guard context.json else { return }
        let after = (try? resolve(group.id, in: store)) ?? group
        try Output.json(["id": group.id, "name": after.groupName ?? "",
                         "members": try store.members(of: group.id).map { ["id": $0.speaker, "role": $0.role.rawValue] }] as [String: Any])
    }

    static func members(_ context: Context) async throws {
        let store = try context.store(readOnly: true)
        let group = try resolve(context.arguments.positional(0), in: store)
        let members = try store.members(of: group.id)
        if context.json {
            try Output.json(members.map { ["id": $0.speaker, "role": $0.role.rawValue] })
            return
        }
        for member in members {
            let name = ChatCommands.shown((try? store.speaker(fromRef: SpeakerRef(identifier: member.speaker))?.name) ?? nil, member.speaker)
            Output.line("\(name)  \(member.role.rawValue)")
        }
    }

    static func list(_ context: Context) async throws {
        let store = try context.store(readOnly: true)
        let groups = try store.conversations(includeArchived: true).filter(\.isGroup)
        if context.json {
            try Output.json(groups.map { group in
                var entry: [String: Any] = ["id": group.id, "name": group.groupName ?? "", "unread": group.unreadCount]
                if let text = group.groupDescription { entry["description"] = text }
                if let size = group.groupAvatarSize { entry["avatar"] = "\(size.width)x\(size.height)" }
                return entry
            })
            return
        }
        for group in groups {
            Output.line("\(group.groupName ?? "")  \(group.unreadCount) unread  \(group.id)" + (group.groupDescription.map { "  — \($0)" } ?? ""))
        }
    }
}
