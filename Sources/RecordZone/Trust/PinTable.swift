import Foundation
import SQLiteKit

/// The one table in which stores and servers keep key chains: `ck_pins`, a row per identity with
/// its whole ``KeyChain`` (current and retired keys) as JSON. Rows are written one identity at a
/// time, in the transaction that stores the records that changed them, so a crash never keeps a
/// record without the pin it made, or a pin without its record.
public enum PinTable {
    /// The table, for a schema migration.
    public static let schema = "CREATE TABLE ck_pins (identity TEXT PRIMARY KEY, chain BLOB NOT NULL) STRICT;"

    /// Every chain in the table. A row that does not decode is skipped (its identity is then
    /// pinned afresh), never fatal.
    public static func load(from db: Database) throws -> [String: KeyChain] {
        let decoder = JSONDecoder()
        var chains = [String: KeyChain]()
        for (identity, blob) in try db.rows("SELECT identity, chain FROM ck_pins", [], { ($0.text(0), $0.blob(1)) }) {
            if let chain = try? decoder.decode(KeyChain.self, from: blob) { chains[identity] = chain }
        }
        return chains
    }

    /// Writes exactly the chains an admission decided (``PinChanges``), inside the transaction
    /// that stores the records they came with; publish them to memory after it commits.
    public static func save(_ changes: PinChanges, in db: Database) throws {
        guard !changes.chains.isEmpty else { return }
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        for (identity, chain) in changes.chains.sorted(by: { $0.key < $1.key }) {
            try db.execute("INSERT INTO ck_pins (identity, chain) VALUES (?, ?) ON CONFLICT (identity) DO UPDATE SET chain = excluded.chain",
                           [identity, try encoder.encode(chain)])
        }
    }

    /// Writes the chains a reader's admissions changed since the last call (``KeyPins/takeChangedChains()``),
    /// inside the caller's transaction. When the
    /// write fails, the chains are handed back to the pins for the next transaction.
    /// - Returns: whether any chain was written.
    @discardableResult
    public static func saveChanges(of pins: KeyPins, in db: Database) throws -> Bool {
        let changed = pins.takeChangedChains()
        guard !changed.isEmpty else { return false }
        do {
            let encoder = JSONEncoder()
            encoder.outputFormatting = .sortedKeys
            for (identity, chain) in changed {
                try db.execute("INSERT INTO ck_pins (identity, chain) VALUES (?, ?) ON CONFLICT (identity) DO UPDATE SET chain = excluded.chain",
                               [identity, try encoder.encode(chain)])
            }
        } catch {
            pins.restoreChangedChains(changed)
            throw error
        }
        return true
    }
}
