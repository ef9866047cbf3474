import Foundation

/// Content types (MIME) by file name, from the freedesktop.org shared MIME
/// database (`/usr/share/mime/globs2`, Debian's shared-mime-info): the
/// highest-weighted glob that matches, case-insensitively as the spec says.
/// Literal suffix globs (`*.md`) and whole names (`makefile`) go through
/// dictionaries; the ten-odd other globs through `fnmatch`, with their C
/// strings made once (a query asks this for every one of 100,000 items).
public final class ContentTypes: Sendable {
    public static let shared = ContentTypes(path: "/usr/share/mime/globs2")

    let bySuffix: [String: String]          // ".md" → text/markdown (lower-cased)
    let byName: [String: String]            // "makefile" → text/x-makefile (lower-cased)
    let patterns: [(glob: ContiguousArray<CChar>, type: String)]   // other globs, lower-cased, in weight order

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
        var byName: [String: String] = [:]
        var wildcards: [(glob: ContiguousArray<CChar>, type: String)] = []
        for (_, glob, type) in patterns.sorted(by: { $0.0 > $1.0 }) {
            let lower = glob.lowercased()
            if lower.contains(where: { "*?[".contains($0) }) {
                wildcards.append((lower.utf8CString, type))
            } else if byName[lower] == nil {
                byName[lower] = type
            }
        }
        self.byName = byName
        self.patterns = wildcards
    }

    /// The content type of a file named `name` (`application/octet-stream` if unknown).
    public func type(ofFileNamed name: String) -> String {
        let lower = name.lowercased()
        var index = lower.firstIndex(of: ".")
        while let dot = index {
            if let type = bySuffix[String(lower[dot...])] { return type }
            index = lower[lower.index(after: dot)...].firstIndex(of: ".")
        }
        if let type = byName[lower] { return type }
        let subject = lower.utf8CString
        return subject.withUnsafeBufferPointer { name in
            for pattern in patterns where pattern.glob.withUnsafeBufferPointer({ fnmatch($0.baseAddress, name.baseAddress, 0) }) == 0 {
                return pattern.type
            }
            return "application/octet-stream"
        }
    }
}
