/// Declarations shared by the executables that make up `convkitd`: `convkitd sync` runs in
/// convkitd-sync (which links the store), while convkitd, which does not, generates its help,
/// completions and manual page from the same declaration.
public enum DaemonCommands {
    public static let sync = Command(
        "convkitd sync", "Keep a store in step with a folder zone or a zone server, continuously.",
        discussion: """
            Pushes each local change as it is committed (by any process writing the store) and pulls
            each remote change as the backend announces it: down one stream from a server (which also
            says when to read the database feed), inotify on a folder, long polls on an older server;
            where nothing says when, the database feed is looked at every --poll-interval. Backs off
            while the backend cannot be reached and catches up when it answers. One log line per event on standard error. Stops cleanly on SIGINT or
            SIGTERM.
            """,
        synopsis: "--store <dir> [--zone-dir <dir> | --server <url>] [<options>]",
        options: [
            .valued("store", "dir", "The store directory (required)."),
            .valued("zone-dir", "dir", "Sync through this folder zone. (default: the backend 'convkit init' saved in the store)"),
            .valued("server", "url", "Sync through this zone server. (default: the backend 'convkit init' saved in the store)"),
            .valued("device", "label", "The device label to write to a folder as. (default: the store's saved one, else the host name)"),
            .valued("identifier", "id", "Set the store's local speaker up as <id> when it has none."),
            .valued("poll-interval", "seconds", "How often to push what is due, and to look at the database feed where the backend does not say when (once a minute where it does). (default: 1)"),
            .valued("log-level", "level", "trace, debug, info, notice, warning, error or critical; info logs one line per event. (default: info)"),
        ])
}
