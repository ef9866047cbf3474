/// Uniform Type Identifiers for `contentType` / `NSMetadataItemContentTypeKey`,
/// from the freedesktop MIME type an item has here (which stays `mimeType`).
///
/// A table of the common types with Apple's identifiers and their conformance
/// (each type's parent; `contentTypeTree` is a type and its ancestors, in
/// order, ending as Apple's trees do in `public.item` / `public.content`).
/// An unknown `text/*` type is `public.text`, `image/*` `public.image`,
/// `audio/*` `public.audio`, `video/*` `public.movie`, anything else
/// `public.data`.
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

    /// UTI → the type it conforms to first (nil: a root).
    static let parent: [String: String] = [
        "public.folder": "public.directory",
        "public.directory": "public.item",
        "public.plain-text": "public.text",
        "net.daringfireball.markdown": "public.plain-text",
        "public.html": "public.text",
        "public.comma-separated-values-text": "public.text",
        "public.xml": "public.text",
        "public.json": "public.text",
        "public.text": "public.data",
        "com.adobe.pdf": "public.data",
        "public.zip-archive": "public.data",
        "public.jpeg": "public.image",
        "public.png": "public.image",
        "com.compuserve.gif": "public.image",
        "public.tiff": "public.image",
        "public.heic": "public.image",
        "public.svg-image": "public.image",
        "public.image": "public.data",
        "public.mp3": "public.audio",
        "public.audio": "public.data",
        "public.mpeg-4": "public.movie",
        "com.apple.quicktime-movie": "public.movie",
        "public.movie": "public.data",
        "public.data": "public.item",
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

    /// The UTI and every type it conforms to, most specific first; content
    /// (what is not a directory) also conforms to `public.content`.
    public static func tree(of uti: String) -> [String] {
        var out = [uti]
        var current = uti
        while let next = parent[current], !out.contains(next) {
            out.append(next)
            current = next
        }
        if !out.contains("public.directory") && uti != "public.item" { out.append("public.content") }
        return out
    }
}
