import Foundation
import Testing
import TestSupport
@testable import RecordZone

@Suite struct SigningTests {
    struct Vector: Sendable, CustomTestStringConvertible {
        var name: String, seed: String, publicKey: String, message: String, signature: String
        var testDescription: String { name }
    }

    /// RFC 8032 section 7.1, tests 1, 2 and 3.
    static let rfc8032: [Vector] = [
        Vector(name: "TEST 1",
               seed: "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
               publicKey: "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a",
               message: "",
               signature: "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"),
        Vector(name: "TEST 2",
               seed: "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
               publicKey: "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c",
               message: "72",
               signature: "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00"),
        Vector(name: "TEST 3",
               seed: "c5aa8df43f9f837bedb7442f31dcb7b166d38535076f094b85ce3a2e0b4458f7",
               publicKey: "fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025",
               message: "af82",
               signature: "6291d657deec24024827e69c3abe01a30ce548a284743a445e3680d7db5ac3ac18ff9b538d16f290ae67f760984dc6594a7c15e9716ed28dc027beceea1ec40a"),
    ]

    @Test(arguments: rfc8032) func rfc8032Vector(_ vector: Vector) throws {
        let key = try SigningKey(seed: try #require(Data(hexString: vector.seed)))
        let message = try #require(Data(hexString: vector.message))
        #expect(key.publicKey.hexString == vector.publicKey)
        let signature = key.sign(message)
        #expect(signature.hexString == vector.signature)
        #expect(Sodium.verify(signature: signature, message: message, publicKey: key.publicKey))
        var tampered = signature
        tampered[0] ^= 1
        #expect(!Sodium.verify(signature: tampered, message: message, publicKey: key.publicKey))
        #expect(!Sodium.verify(signature: signature, message: message + [0], publicKey: key.publicKey))
    }

    @Test func keyFilesAreWrittenPrivateAndRefusedWhenReadableByOthers() throws {
        let dir = try TemporaryDirectory()
        let path = dir.path + "/alice.key"
        let key = SigningKey.generate()
        try KeyFile.write(key, to: path)
        let mode = try #require(FileManager.default.attributesOfItem(atPath: path)[.posixPermissions] as? Int)
        #expect(mode & 0o777 == 0o600)
        #expect(try KeyFile.load(from: path).publicKey == key.publicKey)
        // Writing over an existing key is refused.
        #expect(throws: RecordZoneError.self) { try KeyFile.write(SigningKey.generate(), to: path) }
        chmod(path, 0o644)
        #expect { try KeyFile.load(from: path) } throws: { ($0 as? RecordZoneError)?.code == .notAuthorized }
        chmod(path, 0o600)
        try Data("garbage".utf8).write(to: URL(fileURLWithPath: path))
        chmod(path, 0o600)
        #expect { try KeyFile.load(from: path) } throws: { ($0 as? RecordZoneError)?.code == .invalidArguments }
        #expect { try KeyFile.load(from: dir.path + "/missing.key") } throws: { ($0 as? RecordZoneError)?.code == .ioError }
    }

    @Test func seedsOfTheWrongLengthAreRefused() {
        #expect(throws: RecordZoneError.self) { try SigningKey(seed: Data(count: 31)) }
    }

    @Test func sha256MatchesAKnownDigest() {
        #expect(Sodium.sha256(Data("abc".utf8)).hexString == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
    }
}
