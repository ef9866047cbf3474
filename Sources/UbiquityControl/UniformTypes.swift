/// Uniform Type Identifiers for `contentType` / `NSMetadataItemContentTypeKey`,
/// from the freedesktop MIME type an item has here (which stays `mimeType`),
/// and the conformance tree for `contentTypeTree` / `NSMetadataItemContentTypeTreeKey`.
///
/// `conformsTo` is Apple's declared hierarchy for the types of the MIME table
/// and their ancestors (UniformTypeIdentifiers' UTCoreTypes: `public.text`
/// conforms to `public.data` and `public.content`, `com.adobe.pdf` to
/// `public.data` and `public.composite-content`, …). A tree is that hierarchy
/// walked depth first, each type's parents in declared order, each type once:
/// the order in which Spotlight lists `kMDItemContentTypeTree`
/// (`public.plain-text, public.text, public.data, public.item, public.content`;
/// `public.folder, public.directory, public.item`).
///
/// An unknown `text/*` type is `public.text`, `image/*` `public.image`,
/// `audio/*` `public.audio`, `video/*` `public.movie`, anything else
/// `public.data` (whose tree is `public.data, public.item`: plain bytes are
/// not content).
public enum UniformTypes {
    /// MIME type → UTI.
    static let byMIME: [String: String] = [
        "inode/directory": "public.folder",
        "text/plain": "public.plain-text",
        "text/markdown": "net.daringfireball.markdown",
        "text/html": "public.html",
        "text/csv": "public.comma-separated-values-text",
        "text/xml": "public.xml",
        "application/xml": "public.xml",
        "application/json": "public.json",
        "application/pdf": "com.adobe.pdf",
        "application/zip": "public.zip-archive",
        "application/octet-stream": "public.data",
        "image/jpeg": "public.jpeg",
        "image/png": "public.png",
        "image/gif": "com.compuserve.gif",
        "image/tiff": "public.tiff",
        "image/heic": "public.heic",
        "image/svg+xml": "public.svg-image",
        "audio/mpeg": "public.mp3",
        "video/mp4": "public.mpeg-4",
        "video/quicktime": "com.apple.quicktime-movie",
    ]

    /// UTI → the types it conforms to directly, in declared order. Roots
    /// (`public.item`, `public.content`, `public.archive`) have no entry.
    static let conformsTo: [String: [String]] = [
        "public.folder": ["public.directory"],
        "public.directory": ["public.item"],
        "public.data": ["public.item"],
        "public.composite-content": ["public.content"],
        "public.text": ["public.data", "public.content"],
        "public.plain-text": ["public.text"],
        "net.daringfireball.markdown": ["public.plain-text"],
        "public.html": ["public.text"],
        "public.xml": ["public.text"],
        "public.json": ["public.text"],
        "public.delimited-values-text": ["public.text"],
        "public.comma-separated-values-text": ["public.delimited-values-text"],
        "com.adobe.pdf": ["public.data", "public.composite-content"],
        "public.zip-archive": ["public.data", "public.archive"],
        "public.image": ["public.data", "public.content"],
        "public.jpeg": ["public.image"],
        "public.png": ["public.image"],
        "com.compuserve.gif": ["public.image"],
        "public.tiff": ["public.image"],
        "public.heif-standard": ["public.image"],
        "public.heic": ["public.heif-standard"],
        "public.svg-image": ["public.image"],
        "public.audiovisual-content": ["public.data", "public.content"],
        "public.audio": ["public.audiovisual-content"],
        "public.mp3": ["public.audio"],
        "public.movie": ["public.audiovisual-content"],
        "public.mpeg-4": ["public.movie"],
        "com.apple.quicktime-movie": ["public.movie"],
    ]

    /// The UTI of a MIME type.
    public static func identifier(forMIMEType mime: String) -> String {
        if let uti = byMIME[mime] { return uti }
        if mime.hasPrefix("text/") { return "public.text" }
        if mime.hasPrefix("image/") { return "public.image" }
        if mime.hasPrefix("audio/") { return "public.audio" }
        if mime.hasPrefix("video/") { return "public.movie" }
        return "public.data"
    }

    /// The UTI and every type it conforms to, directly or not: depth first,
    /// parents in declared order, each once. A type the table does not know
    /// is a tree of its own.
    public static func tree(of uti: String) -> [String] {
        if let known = trees[uti] { return known }
        return walk(uti)
    }

    /// The trees of every type in the table, computed once.
    private static let trees: [String: [String]] = {
        var all = Set(conformsTo.keys)
        for parents in conformsTo.values { all.formUnion(parents) }
        return Dictionary(uniqueKeysWithValues: all.map { ($0, walk($0)) })
    }()

    private static func walk(_ uti: String) -> [String] {
        var out: [String] = []
        var seen = Set<String>()
        // An explicit stack (parents pushed in reverse): preorder, no recursion.
        var stack = [uti]
        while let next = stack.popLast() {
            guard seen.insert(next).inserted else { continue }
            out.append(next)
            stack.append(contentsOf: (conformsTo[next] ?? []).reversed())
        }
        return out
    }
}
