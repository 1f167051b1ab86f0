public enum ZoneServerVersion { public static let string = "0.1.0" }
