import Foundation

/// A self-signed certificate for 127.0.0.1, made by `openssl` (installed by the setup script)
/// into a directory, for tests of HTTPS.
public struct TestCertificate: Sendable {
    public let certificateFile: String
    public let keyFile: String

    public init(in directory: String) throws {
        certificateFile = directory + "/cert.pem"
        keyFile = directory + "/key.pem"
        let status = try ChildProcess.runToEnd("/usr/bin/openssl", [
            "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", keyFile, "-out", certificateFile,
            "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"])
        guard status == 0 else { throw POSIXError(.EIO) }
    }
}
