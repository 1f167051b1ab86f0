import RecordZone
import SQLiteKit

/// The store's schema, one migration per version (`PRAGMA user_version`).
///
/// Sync bookkeeping tables carry the `ck_` prefix; every table is STRICT.
enum StoreSchema {
    static let migrations: [Migration] = [
        Migration(version: 1, sql: """
            CREATE TABLE ck_meta (key TEXT PRIMARY KEY, value ANY) STRICT;
            -- The winning version of every record the store holds (canonical bytes).
            CREATE TABLE ck_records (
                zone TEXT NOT NULL, name TEXT NOT NULL, type TEXT NOT NULL,
                clock INTEGER NOT NULL, author BLOB NOT NULL, signature BLOB NOT NULL,
                is_deleted INTEGER NOT NULL, record BLOB NOT NULL,
                PRIMARY KEY (zone, name)) STRICT, WITHOUT ROWID;
            -- Local versions waiting to be pushed; one row per record, the newest version.
            CREATE TABLE ck_outbox (
                id INTEGER PRIMARY KEY, zone TEXT NOT NULL, name TEXT NOT NULL, record BLOB NOT NULL,
                attempts INTEGER NOT NULL DEFAULT 0, next_attempt_at INTEGER NOT NULL DEFAULT 0, last_error TEXT,
                UNIQUE (zone, name)) STRICT;
            CREATE TABLE ck_zone_state (zone TEXT PRIMARY KEY, token BLOB, is_created INTEGER NOT NULL DEFAULT 0) STRICT;
            CREATE TABLE ck_quarantine (
                id INTEGER PRIMARY KEY, zone TEXT, name TEXT, reason TEXT NOT NULL, source TEXT NOT NULL,
                record BLOB, received_at INTEGER NOT NULL) STRICT;
            \(PinTable.schema)

            CREATE TABLE speakers (
                identifier TEXT PRIMARY KEY, name TEXT NOT NULL, public_key BLOB,
                is_known INTEGER NOT NULL DEFAULT 0) STRICT;
            CREATE TABLE speaker_tags (
                tag TEXT NOT NULL, identifier TEXT NOT NULL, PRIMARY KEY (tag, identifier)) STRICT, WITHOUT ROWID;
            CREATE INDEX speaker_tags_by_speaker ON speaker_tags (identifier);
            CREATE TABLE conversations (
                zone TEXT PRIMARY KEY, other TEXT NOT NULL, started_by TEXT, joined_by TEXT,
                last_message_at INTEGER) STRICT;
            CREATE INDEX conversations_by_other ON conversations (other);
            CREATE TABLE conversation_members (
                zone TEXT NOT NULL, speaker TEXT NOT NULL, clock INTEGER NOT NULL,
                PRIMARY KEY (zone, speaker)) STRICT, WITHOUT ROWID;
            CREATE TABLE messages (
                zone TEXT NOT NULL, name TEXT NOT NULL, speaker TEXT NOT NULL, listener TEXT NOT NULL,
                content TEXT NOT NULL, spoken_at INTEGER NOT NULL, edited_at INTEGER, read_at INTEGER,
                is_deleted INTEGER NOT NULL DEFAULT 0,
                sync_state INTEGER NOT NULL, sync_error TEXT,
                PRIMARY KEY (zone, name)) STRICT;
            -- Newest N of a conversation, and older pages before a cursor.
            CREATE INDEX messages_by_time ON messages (zone, spoken_at, name);
            -- Unread counts: the local speaker's unread messages, per conversation.
            CREATE INDEX messages_unread ON messages (listener, zone) WHERE read_at IS NULL AND is_deleted = 0;
            CREATE TABLE receipts (
                zone TEXT NOT NULL, message TEXT NOT NULL, reader TEXT NOT NULL, read_at INTEGER NOT NULL,
                PRIMARY KEY (zone, message, reader)) STRICT, WITHOUT ROWID;
            """),
        // Version 2: quarantine rows keep the reason's code and the identity it concerns, so a
        // record held back for an identity conflict can be admitted again once it is settled.
        Migration(version: 2, sql: """
            ALTER TABLE ck_quarantine ADD COLUMN code TEXT;
            ALTER TABLE ck_quarantine ADD COLUMN identity TEXT;
            CREATE INDEX ck_quarantine_by_identity ON ck_quarantine (identity) WHERE identity IS NOT NULL;
            """),
        // Version 3: a profile comes from the speaker's zone and from the directory; the newest
        // version (by clock) is the one shown.
        Migration(version: 3, sql: "ALTER TABLE speakers ADD COLUMN clock INTEGER NOT NULL DEFAULT 0;"),
        // Version 4: avatars. A profile's avatar (an asset: hash and size, and its pixel size),
        // why it could not be had (a missing or corrupt asset; cleared when it changes), and the
        // image cache's files (`Images/`, by hash) with their last use, for LRU eviction.
        Migration(version: 4, sql: """
            ALTER TABLE speakers ADD COLUMN avatar_hash BLOB;
            ALTER TABLE speakers ADD COLUMN avatar_size INTEGER;
            ALTER TABLE speakers ADD COLUMN avatar_width INTEGER;
            ALTER TABLE speakers ADD COLUMN avatar_height INTEGER;
            ALTER TABLE speakers ADD COLUMN avatar_error TEXT;
            CREATE TABLE image_cache (hash BLOB PRIMARY KEY, size INTEGER NOT NULL, last_used INTEGER NOT NULL) STRICT, WITHOUT ROWID;
            CREATE INDEX image_cache_by_use ON image_cache (last_used);
            """),
        // Version 5: a failed message keeps why as a code (``SyncFailure``), beside the text.
        Migration(version: 5, sql: "ALTER TABLE messages ADD COLUMN sync_error_code TEXT;"),
        // Version 6: a quarantined version of one of the local speaker's records, signed by its
        // revoked device or retired key, whose valid version this store stated again (once).
        Migration(version: 6, sql: "ALTER TABLE ck_quarantine ADD COLUMN restated INTEGER NOT NULL DEFAULT 0;"),
        // Version 7: an outbox entry's last failure keeps its code (``OutboxEntry/lastErrorCode``).
        Migration(version: 7, sql: "ALTER TABLE ck_outbox ADD COLUMN last_error_code TEXT;"),
        // Version 8: groups (docs/PROTOCOL.md §3.1). A group's conversation row has `other` = ''
        // and the group's name; its members now with their roles; each speaker's runs of
        // membership (from the clock of the change that began one to the one that ended it),
        // which decide the group's messages. All follow the group's GroupChange records in
        // ck_records. A group message has `listener` = ''.
        Migration(version: 8, sql: """
            ALTER TABLE conversations ADD COLUMN group_name TEXT;
            CREATE TABLE group_members (zone TEXT NOT NULL, speaker TEXT NOT NULL, role TEXT NOT NULL, PRIMARY KEY (zone, speaker)) STRICT, WITHOUT ROWID;
            CREATE TABLE group_runs (zone TEXT NOT NULL, speaker TEXT NOT NULL, from_clock INTEGER NOT NULL, until_clock INTEGER) STRICT;
            CREATE INDEX group_runs_by_speaker ON group_runs (zone, speaker);
            -- The last change decided (by the rule's order), so that one after it is decided
            -- alone against the tables above; one before it decides the group again whole.
            CREATE TABLE group_state (zone TEXT PRIMARY KEY, last_clock INTEGER NOT NULL, last_name TEXT NOT NULL,
                is_created INTEGER NOT NULL, name TEXT) STRICT;
            """),
        // Version 9: what members read of what was said outside their membership (§3.1 history).
        Migration(version: 9, sql: """
            ALTER TABLE group_state ADD COLUMN history TEXT NOT NULL DEFAULT 'since-added';
            """),
        // Version 10: a followed speaker's zone the backend does not have (someone added to a
        // group who never set up): read again when the database feed names it, not every sync.
        Migration(version: 10, sql: """
            ALTER TABLE ck_zone_state ADD COLUMN is_missing INTEGER NOT NULL DEFAULT 0;
            """),
        // Version 11: a group's description and avatar (the last `describe` that took effect).
        Migration(version: 11, sql: """
            ALTER TABLE group_state ADD COLUMN description TEXT;
            ALTER TABLE group_state ADD COLUMN avatar_hash BLOB;
            ALTER TABLE group_state ADD COLUMN avatar_size INTEGER;
            ALTER TABLE group_state ADD COLUMN avatar_width INTEGER;
            ALTER TABLE group_state ADD COLUMN avatar_height INTEGER;
            """),
        // Version 12: encryption (docs/PROTOCOL.md §3.2). Every device's X25519 key as its
        // EncryptionKey record says; the sender keys this device holds (its own, and those shared
        // with it), by conversation and epoch; this device's own epochs, newest last, each with
        // the clocks of its first and last message, and the members it was shared with and their
        // devices (32-byte keys, concatenated, sorted);
        // and a message whose epoch's key is not held yet (shown as waiting for its key).
        Migration(version: 12, sql: """
            CREATE TABLE encryption_keys (identity TEXT NOT NULL, device BLOB NOT NULL, key BLOB NOT NULL,
                PRIMARY KEY (identity, device)) STRICT, WITHOUT ROWID;
            CREATE TABLE sender_keys (zone TEXT NOT NULL, epoch BLOB NOT NULL, sender TEXT NOT NULL, device BLOB NOT NULL, key BLOB NOT NULL,
                PRIMARY KEY (zone, epoch)) STRICT, WITHOUT ROWID;
            CREATE TABLE own_epochs (zone TEXT NOT NULL, epoch BLOB NOT NULL, created_at INTEGER NOT NULL, messages INTEGER NOT NULL DEFAULT 0,
                first_clock INTEGER, last_clock INTEGER, UNIQUE (zone, epoch)) STRICT;
            CREATE TABLE epoch_recipients (zone TEXT NOT NULL, epoch BLOB NOT NULL, member TEXT NOT NULL, devices BLOB NOT NULL,
                PRIMARY KEY (zone, epoch, member)) STRICT, WITHOUT ROWID;
            ALTER TABLE messages ADD COLUMN waiting_epoch BLOB;
            CREATE INDEX messages_waiting ON messages (zone, waiting_epoch) WHERE waiting_epoch IS NOT NULL;
            """),
        // Version 13: reactions, one per reactor per message (its emoji empty while it waits
        // for the key of its epoch, as a message's content does).
        Migration(version: 13, sql: """
            CREATE TABLE reactions (zone TEXT NOT NULL, message TEXT NOT NULL, reactor TEXT NOT NULL, emoji TEXT NOT NULL,
                reacted_at INTEGER NOT NULL, waiting_epoch BLOB, PRIMARY KEY (zone, message, reactor)) STRICT, WITHOUT ROWID;
            CREATE INDEX reactions_waiting ON reactions (zone, waiting_epoch) WHERE waiting_epoch IS NOT NULL;
            """),
        // Version 14: replies: the name of the message a message answers (from its sealed part).
        Migration(version: 14, sql: """
            ALTER TABLE messages ADD COLUMN reply_to TEXT;
            CREATE INDEX messages_replies ON messages (zone, reply_to) WHERE reply_to IS NOT NULL;
            """),
        // Version 15: the speakers a message mentions, each at a span of its content (UTF-8 bytes).
        Migration(version: 15, sql: """
            CREATE TABLE message_mentions (zone TEXT NOT NULL, name TEXT NOT NULL, start INTEGER NOT NULL, length INTEGER NOT NULL, speaker TEXT NOT NULL,
                PRIMARY KEY (zone, name, start)) STRICT, WITHOUT ROWID;
            CREATE INDEX message_mentions_speaker ON message_mentions (speaker);
            """),
        // Version 16: full-text search over the messages as shown here (opened, not deleted):
        // an FTS5 index whose text is the messages table's own (external content, by rowid),
        // kept in step by triggers on every insert, change and removal of a message.
        Migration(version: 16, sql: """
            CREATE VIRTUAL TABLE message_search USING fts5(content, content = 'messages', content_rowid = 'rowid', tokenize = 'unicode61 remove_diacritics 2');
            INSERT INTO message_search (rowid, content) SELECT rowid, content FROM messages WHERE is_deleted = 0;
            CREATE TRIGGER message_search_insert AFTER INSERT ON messages WHEN new.is_deleted = 0 BEGIN
                INSERT INTO message_search (rowid, content) VALUES (new.rowid, new.content);
            END;
            CREATE TRIGGER message_search_delete AFTER DELETE ON messages WHEN old.is_deleted = 0 BEGIN
                INSERT INTO message_search (message_search, rowid, content) VALUES ('delete', old.rowid, old.content);
            END;
            CREATE TRIGGER message_search_update AFTER UPDATE OF content, is_deleted ON messages BEGIN
                INSERT INTO message_search (message_search, rowid, content) SELECT 'delete', old.rowid, old.content WHERE old.is_deleted = 0;
                INSERT INTO message_search (rowid, content) SELECT new.rowid, new.content WHERE new.is_deleted = 0;
            END;
            """),
        // Version 17: a reaction's clock, so a group counts it only if its reactor was a member then.
        Migration(version: 17, sql: "ALTER TABLE reactions ADD COLUMN clock INTEGER NOT NULL DEFAULT 0;"),
        // Version 18: a message's custom payload (an app's type and data), and the versions of
        // its text before the current one (its record's history, oldest first: version 0).
        Migration(version: 18, sql: """
            ALTER TABLE messages ADD COLUMN custom_type TEXT;
            ALTER TABLE messages ADD COLUMN custom_data BLOB;
            CREATE TABLE message_versions (zone TEXT NOT NULL, name TEXT NOT NULL, version INTEGER NOT NULL, content TEXT NOT NULL, at INTEGER NOT NULL,
                PRIMARY KEY (zone, name, version)) STRICT, WITHOUT ROWID;
            """),
        // Version 19: delivered ticks (docs/PROTOCOL.md §3). How many Message records this store
        // holds of each sender per zone (by the name's `m.<h(sender)>.` prefix) and the newest
        // name, kept as records arrive (what this device's Delivery record says); and, from the
        // other members' devices' Delivery records, the newest of the local speaker's messages
        // each holds with every one before it.
        Migration(version: 19, sql: """
            CREATE TABLE held_messages (zone TEXT NOT NULL, sender TEXT NOT NULL, count INTEGER NOT NULL, newest TEXT NOT NULL,
                PRIMARY KEY (zone, sender)) STRICT, WITHOUT ROWID;
            INSERT INTO held_messages (zone, sender, count, newest)
                SELECT zone, substr(name, 1, 19), count(*), max(name) FROM ck_records
                WHERE type = 'Message' AND length(name) > 19 AND substr(name, 1, 2) = 'm.' AND substr(name, 19, 1) = '.' GROUP BY zone, substr(name, 1, 19);
            CREATE TABLE deliveries (zone TEXT NOT NULL, name TEXT NOT NULL, member TEXT NOT NULL, through TEXT NOT NULL,
                PRIMARY KEY (zone, name)) STRICT, WITHOUT ROWID;
            CREATE INDEX deliveries_by_member ON deliveries (zone, member, through);
            CREATE INDEX messages_failed ON messages (zone, name) WHERE sync_state = 2;
            """),
        // Version 20: what this device keeps of a conversation for its person alone (never
        // synced): archived, muted until, pinned at, marked unread, a draft.
        Migration(version: 20, sql: """
            CREATE TABLE conversation_settings (zone TEXT PRIMARY KEY, is_archived INTEGER NOT NULL DEFAULT 0, muted_until INTEGER, pinned_at INTEGER,
                is_marked_unread INTEGER NOT NULL DEFAULT 0, draft TEXT) STRICT;
            """),
        // Version 21: files sent with messages (docs/PROTOCOL.md §3.4). The name, type and size
        // shown with the message; the rest of its manifest (key, chunks' hashes, thumbnail) apart,
        // with where this device stands with it: how many chunks of its own file it uploaded
        // (NULL: someone else's), the bytes of the whole file in the cache (NULL: not here), its
        // last use (the cache is emptied least recently used first), and a file whose message
        // went (its cache directory is removed after the transaction).
        Migration(version: 21, sql: """
            ALTER TABLE messages ADD COLUMN file_name TEXT;
            ALTER TABLE messages ADD COLUMN file_type TEXT;
            ALTER TABLE messages ADD COLUMN file_size INTEGER;
            CREATE TABLE attachments (zone TEXT NOT NULL, name TEXT NOT NULL, file_key BLOB NOT NULL, chunks BLOB NOT NULL, thumbnail BLOB,
                image_width INTEGER, image_height INTEGER, uploaded INTEGER, held INTEGER, last_used INTEGER NOT NULL DEFAULT 0,
                discarded INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (zone, name)) STRICT, WITHOUT ROWID;
            CREATE INDEX attachments_held ON attachments (last_used) WHERE held IS NOT NULL;
            """),
        // Version 22: why the sync stopped downloading a file by itself (damaged or missing on
        // the backend); an explicit download still tries.
        Migration(version: 22, sql: "ALTER TABLE attachments ADD COLUMN problem TEXT;"),
        // Version 23: whom the local speaker blocks (their messages are not shown), as its own
        // `Block` records in the pair zones (`zone`) say — written here or by its other devices.
        Migration(version: 23, sql: "CREATE TABLE blocked_speakers (identity TEXT PRIMARY KEY, zone TEXT NOT NULL, blocked_at INTEGER NOT NULL) STRICT;"),
        // Version 24: the search index fed in batches above a mark, not by a trigger per row
        // (``SearchIndex``).
        Migration(version: 24, sql: SearchIndex.schema),
        // Version 25: the outbox references the stored version (zone, name, clock) instead of
        // holding a second copy of its bytes (``Outbox``).
        Migration(version: 25, sql: Outbox.referencing),
        // Version 26: a conversation's newest message is read from its messages (the time index
        // answers it) instead of being written with every message.
        Migration(version: 26, sql: "ALTER TABLE conversations DROP COLUMN last_message_at;"),
        // Version 27: the outbox keyed by its record alone, ordered by the versions' clocks
        // (one tree written per version queued, not two).
        Migration(version: 27, sql: Outbox.schema),
        // Version 28: a message's mentions kept in its row (`start:length:speaker`, space-separated;
        // NULL for none), so a page of messages reads no other table for them; `message_mentions`
        // stays the index of who is mentioned where.
        Migration(version: 28, sql: """
            ALTER TABLE messages ADD COLUMN mentions TEXT;
            UPDATE messages SET mentions = (SELECT group_concat(x.start || ':' || x.length || ':' || x.speaker, ' ')
                                            FROM message_mentions x WHERE x.zone = messages.zone AND x.name = messages.name)
                WHERE EXISTS (SELECT 1 FROM message_mentions x WHERE x.zone = messages.zone AND x.name = messages.name);
            """),
        // Version 29: a message the local speaker said is marked in its row (`is_own`), so the
        // unread index holds only messages said to it: a send writes no page of it.
        Migration(version: 29, sql: """
            ALTER TABLE messages ADD COLUMN is_own INTEGER NOT NULL DEFAULT 0;
            UPDATE messages SET is_own = 1 WHERE speaker = (SELECT value FROM ck_meta WHERE key = 'local_speaker');
            DROP INDEX messages_unread;
            CREATE INDEX messages_unread ON messages (zone, listener) WHERE read_at IS NULL AND is_deleted = 0 AND is_own = 0;
            """),
        // Version 30: the records in a rowid table, unique by (zone, name): a new version is
        // appended at the table's end, and only its small key goes into the middle of a tree.
        // (Keyed by (zone, name) WITHOUT ROWID, rows of about 750 bytes went five to a leaf, and
        // an insert in the middle of a full leaf rebalanced it with its neighbours: three pages.)
        Migration(version: 30, sql: """
            CREATE TABLE ck_records_appended (
                zone TEXT NOT NULL, name TEXT NOT NULL, type TEXT NOT NULL,
                clock INTEGER NOT NULL, author BLOB NOT NULL, signature BLOB NOT NULL,
                is_deleted INTEGER NOT NULL, record BLOB NOT NULL,
                UNIQUE (zone, name)) STRICT;
            INSERT INTO ck_records_appended (zone, name, type, clock, author, signature, is_deleted, record)
                SELECT zone, name, type, clock, author, signature, is_deleted, record FROM ck_records ORDER BY zone, name;
            DROP TABLE ck_records;
            ALTER TABLE ck_records_appended RENAME TO ck_records;
            """),
    ]
}

/// The `sync_state` column's values.
enum SyncStateColumn: Int64 {
    case synced = 0, pending = 1, failed = 2
}
