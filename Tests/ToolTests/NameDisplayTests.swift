import Foundation
import Testing
import TestSupport

/// Names are free-form but shown with their identity: mallory naming herself "Bob" shows as
/// "Bob (mallory)", never as Bob; a look-alike identifier is refused at `init`.
@Suite struct NameDisplayTests {
    @Test func aNameIsShownWithItsIdentityAndLookAlikeIdentifiersAreRefused() async throws {
        let dir = try TemporaryDirectory("convkit-names")
        let folder = dir.path + "/shared", bob = ["--store", dir.path + "/bob"], mallory = ["--store", dir.path + "/mallory"]
        func run(_ arguments: [String]) async throws -> ConvkitTests.Run { try await ConvkitTests.convkit(arguments) }
        #expect(try await run(["init", "--id", "bob", "--name", "Bob", "--zone-dir", folder, "--device", "phone"] + bob).status == 0)
        #expect(try await run(["init", "--id", "mallory", "--name", "Bob", "--zone-dir", folder, "--device", "x"] + mallory).status == 0)
        #expect(try await run(["send", "bob", "I owe mallory 500 EUR", "--sync"] + mallory).status == 0)
        #expect(try await run(["sync"] + bob).status == 0)
        let shown = try await run(["messages", "mallory"] + bob).out
        #expect(shown.contains("Bob (mallory): I owe mallory 500 EUR"), "\(shown)")
        let fullwidth = try await run(["init", "--id", "\u{FF42}ob", "--name", "Bob", "--zone-dir", folder, "--device", "y", "--store", dir.path + "/fake"])
        #expect(fullwidth.status == 1 && fullwidth.err.contains("identifier rule"), "\(fullwidth.err)")
    }
}
