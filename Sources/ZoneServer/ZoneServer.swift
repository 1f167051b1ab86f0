/// ZoneServer: the HTTP zone server behind `convkitd serve`. Filled by the HTTP issue.
public enum ZoneServerInfo {
    public static let version = "0.1.0"
}
