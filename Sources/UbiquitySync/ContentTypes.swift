import Foundation

/// Content types (MIME) by file name, from the freedesktop.org shared MIME
/// database (`/usr/share/mime/globs2`, Debian's shared-mime-info): the
/// highest-weighted glob that matches, literal suffix globs (`*.md`) through
/// a dictionary, the few others by pattern.
public final class ContentTypes: Sendable {
    public static let shared = ContentTypes(path: "/usr/share/mime/globs2")

    let bySuffix: [String: String]          // ".md" → text/markdown (lower-cased)
    let patterns: [(String, String)]        // other globs, in weight order

    init(path: String) {
        var bySuffix: [String: (Int, String)] = [:]
        var patterns: [(Int, String, String)] = []
        let text = (try? String(contentsOfFile: path, encoding: .utf8)) ?? ""
        for line in text.split(separator: "\n") where !line.hasPrefix("#") {
            let fields = line.split(separator: ":", maxSplits: 2, omittingEmptySubsequences: false)
            guard fields.count == 3, let weight = Int(fields[0]) else { continue }
            let type = String(fields[1])
            let glob = String(fields[2].split(separator: ":").first ?? "")
            if glob.hasPrefix("*."), !glob.dropFirst(2).contains(where: { "*?[".contains($0) }) {
                let suffix = String(glob.dropFirst()).lowercased()
                if (bySuffix[suffix]?.0 ?? -1) < weight { bySuffix[suffix] = (weight, type) }
            } else {
                patterns.append((weight, glob, type))
            }
        }
        self.bySuffix = bySuffix.mapValues(\.1)
        self.patterns = patterns.sorted { $0.0 > $1.0 }.map { ($0.1, $0.2) }
    }

    /// The content type of a file named `name` (`application/octet-stream` if unknown).
    public func type(ofFileNamed name: String) -> String {
        let lower = name.lowercased()
        var index = lower.firstIndex(of: ".")
        while let dot = index {
            if let type = bySuffix[String(lower[dot...])] { return type }
            index = lower[lower.index(after: dot)...].firstIndex(of: ".")
        }
        for (glob, type) in patterns where fnmatch(glob, name, 0) == 0 { return type }
        return "application/octet-stream"
    }
}
