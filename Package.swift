// swift-tools-version:6.0
import PackageDescription

let package = Package(
    name: "ConversationKit",
    products: [
        .library(name: "RecordZone", targets: ["RecordZone"]),
        .library(name: "ConversationKit", targets: ["ConversationKit"]),
        .library(name: "ChatSchema", targets: ["ChatSchema"]),
        .library(name: "ZoneServer", targets: ["ZoneServer"]),
        .library(name: "SQLiteKit", targets: ["SQLiteKit"]),
        .library(name: "ImageKit", targets: ["ImageKit"]),
        .executable(name: "convkitd", targets: ["convkitd"]),
        .executable(name: "convkit", targets: ["convkit"]),
        .executable(name: "convkit-bench", targets: ["convkit-bench"]),
    ],
    targets: [
        // C libraries from Debian.
        .systemLibrary(
            name: "CSQLite", path: "Sources/CSQLite", pkgConfig: "sqlite3",
            providers: [.apt(["libsqlite3-dev"])]),
        .systemLibrary(
            name: "CSodium", path: "Sources/CSodium", pkgConfig: "libsodium",
            providers: [.apt(["libsodium-dev"])]),
        .systemLibrary(
            name: "CLibMicroHTTPD", path: "Sources/CLibMicroHTTPD", pkgConfig: "libmicrohttpd",
            providers: [.apt(["libmicrohttpd-dev"])]),
        .systemLibrary(
            name: "CCurl", path: "Sources/CCurl", pkgConfig: "libcurl",
            providers: [.apt(["libcurl4-openssl-dev"])]),
        .systemLibrary(
            name: "CPNG", path: "Sources/CPNG", pkgConfig: "libpng",
            providers: [.apt(["libpng-dev"])]),
        .systemLibrary(
            name: "CTurboJPEG", path: "Sources/CTurboJPEG", pkgConfig: "libturbojpeg",
            providers: [.apt(["libturbojpeg0-dev"])]),
        .systemLibrary(
            name: "CPostgres", path: "Sources/CPostgres", pkgConfig: "libpq",
            providers: [.apt(["libpq-dev"])]),
        .systemLibrary(
            name: "CNcurses", path: "Sources/CNcurses",
            providers: [.apt(["libncurses-dev"])]),
        // MHD_start_daemon is variadic: a small C shim calls it for Swift.
        .target(name: "CMicroHTTPD", dependencies: ["CLibMicroHTTPD"], path: "Sources/CMicroHTTPD"),

        // The modules: tools → ConversationKit → ChatSchema, ZoneServer → RecordZone, ImageKit → SQLiteKit → C.
        .target(name: "RecordZone", dependencies: ["CSodium", "CCurl", "SQLiteKit"]),
        .target(name: "SQLiteKit", dependencies: ["CSQLite"]),
        .target(name: "ImageKit", dependencies: ["CPNG", "CTurboJPEG"]),
        // libpq for the zone server's PostgreSQL storage.
        .target(name: "PostgresKit", dependencies: ["CPostgres"]),
        // What a chat server needs of the chat (rules, indexes, zone access), without the store.
        .target(name: "ChatSchema", dependencies: ["RecordZone"]),
        .target(name: "ConversationKit", dependencies: ["ChatSchema", "RecordZone", "SQLiteKit", "ImageKit"]),
        .target(
            name: "ZoneServer", dependencies: ["RecordZone", "SQLiteKit", "PostgresKit", "CMicroHTTPD", "CLibMicroHTTPD"],
            exclude: ["openapi.json"]),

        // Tools.
        .target(name: "ToolSupport", dependencies: ["RecordZone"], path: "Tools/ToolSupport"),
        // A crowd of online clients holding long polls, for the capacity bench and its tests.
        .target(name: "Crowd", dependencies: ["RecordZone", "CCrowd"], path: "Tools/Crowd"),
        .target(name: "CCrowd", path: "Tools/CCrowd"),
        // The chat view's terminal: ncursesw behind a few calls, and the terminal put back on
        // every way out (a signal, a crash, exit).
        .target(name: "CTerminal", dependencies: ["CNcurses"], path: "Tools/CTerminal",
                linkerSettings: [.linkedLibrary("ncursesw"), .linkedLibrary("tinfo")]),
        // convkitd serves (and migrates, replicates) without the store; `convkitd sync` runs
        // convkitd-sync, beside it, which holds one.
        .executableTarget(
            name: "convkitd", dependencies: ["ChatSchema", "ZoneServer", "RecordZone", "ToolSupport"],
            path: "Tools/convkitd"),
        .executableTarget(
            name: "convkitd-sync", dependencies: ["ConversationKit", "RecordZone", "ToolSupport"],
            path: "Tools/convkitd-sync"),
        .executableTarget(
            name: "convkit", dependencies: ["ConversationKit", "RecordZone", "ImageKit", "ToolSupport", "CTerminal"],
            path: "Tools/convkit"),
        .executableTarget(
            name: "convkit-bench", dependencies: ["ConversationKit", "RecordZone", "ZoneServer", "PostgresKit", "ImageKit", "ToolSupport", "ChatSchema", "CSodium", "CSQLite", "CRawLimits", "CPNG", "CTurboJPEG", "Crowd"],
            path: "Tools/convkit-bench"),
        // The raw limits the bench compares against: a bare libmicrohttpd responder, a TCP echo.
        .target(name: "CRawLimits", dependencies: ["CLibMicroHTTPD", "CCurl"], path: "Tools/CRawLimits"),
        // libFuzzer targets for the decoders (scripts/fuzz.sh builds them with the sanitizers).
        .executableTarget(name: "convkit-fuzz", dependencies: ["RecordZone", "ImageKit"], path: "Tools/convkit-fuzz"),
        // Helpers the tests run as real processes.
        .executableTarget(
            name: "convkit-zone-writer", dependencies: ["RecordZone", "ToolSupport"],
            path: "Tools/convkit-zone-writer"),
        .executableTarget(
            name: "convkit-lock-holder", dependencies: ["SQLiteKit", "ToolSupport"],
            path: "Tools/convkit-lock-holder"),
        .executableTarget(
            name: "convkit-store-sync", dependencies: ["ConversationKit", "RecordZone", "SQLiteKit", "ToolSupport"],
            path: "Tools/convkit-store-sync"),

        // Tests.
        .target(name: "CSpawn", path: "Tests/CSpawn"),
        .target(name: "TestSupport", dependencies: ["CSpawn", "ImageKit", "CPNG", "PostgresKit"], path: "Tests/TestSupport"),
        // The test hooks that reach into backends' internals (planting records, rewinding a zone).
        .target(name: "StorageTestSupport", dependencies: ["RecordZone", "ZoneServer", "SQLiteKit", "PostgresKit"], path: "Tests/StorageTestSupport"),
        .testTarget(name: "ImageKitTests", dependencies: ["ImageKit", "TestSupport"]),
        .testTarget(name: "PostgresKitTests", dependencies: ["PostgresKit", "TestSupport"]),
        .testTarget(name: "RecordZoneTests", dependencies: ["RecordZone", "ZoneServer", "TestSupport", "StorageTestSupport", "convkit-zone-writer"]),
        .testTarget(
            name: "ConversationKitTests",
            dependencies: ["ConversationKit", "RecordZone", "ZoneServer", "ImageKit", "TestSupport", "StorageTestSupport", "convkit-store-sync", "convkit-lock-holder"]),
        .testTarget(name: "ToolTests", dependencies: ["ConversationKit", "ImageKit", "RecordZone", "SQLiteKit", "TestSupport", "convkit", "convkitd", "convkitd-sync"]),
        .testTarget(name: "ZoneServerTests", dependencies: ["ZoneServer", "PostgresKit", "ConversationKit", "RecordZone", "TestSupport", "StorageTestSupport", "Crowd", "convkitd", "convkitd-sync"],
                    exclude: ["Browser"]),
    ],
    swiftLanguageModes: [.v6]
)
