import Testing
@testable import UbiquityControl

@Suite struct UniformTypesTests {
    @Test(arguments: [
        ("inode/directory", "public.folder"), ("text/plain", "public.plain-text"), ("image/jpeg", "public.jpeg"),
        ("image/png", "public.png"), ("application/json", "public.json"), ("text/markdown", "net.daringfireball.markdown"),
        ("application/octet-stream", "public.data"), ("application/x-unknown", "public.data"),
        ("text/x-unknown", "public.text"), ("image/x-unknown", "public.image"),
    ])
    func identifierOfAMIMEType(mime: String, uti: String) {
        #expect(UniformTypes.identifier(forMIMEType: mime) == uti)
    }

    /// Trees as Spotlight gives kMDItemContentTypeTree for these types.
    @Test(arguments: [
        ("public.plain-text", ["public.plain-text", "public.text", "public.data", "public.item", "public.content"]),
        ("public.jpeg", ["public.jpeg", "public.image", "public.data", "public.item", "public.content"]),
        ("public.folder", ["public.folder", "public.directory", "public.item"]),
        ("net.daringfireball.markdown",
         ["net.daringfireball.markdown", "public.plain-text", "public.text", "public.data", "public.item", "public.content"]),
        ("com.adobe.pdf", ["com.adobe.pdf", "public.data", "public.item", "public.composite-content", "public.content"]),
        ("public.comma-separated-values-text",
         ["public.comma-separated-values-text", "public.delimited-values-text", "public.text", "public.data", "public.item", "public.content"]),
        ("public.heic", ["public.heic", "public.heif-standard", "public.image", "public.data", "public.item", "public.content"]),
        ("public.mpeg-4", ["public.mpeg-4", "public.movie", "public.audiovisual-content", "public.data", "public.item", "public.content"]),
        ("public.mp3", ["public.mp3", "public.audio", "public.audiovisual-content", "public.data", "public.item", "public.content"]),
        ("public.zip-archive", ["public.zip-archive", "public.data", "public.item", "public.archive"]),
        ("public.data", ["public.data", "public.item"]),
        ("public.item", ["public.item"]),
        ("com.example.unknown", ["com.example.unknown"]),
    ])
    func treesAreTheTypeAndWhatItConformsTo(uti: String, expected: [String]) {
        #expect(UniformTypes.tree(of: uti) == expected)
    }

    /// Every type of the MIME table has a tree that starts with the type, holds
    /// each member's declared parents, lists each type once, and ends in
    /// public.item (and, for what is not a folder, public.content).
    @Test func everyTreeIsClosedUnderConformance() {
        for uti in Set(UniformTypes.byMIME.values) {
            let tree = UniformTypes.tree(of: uti)
            #expect(tree.first == uti, "\(uti): \(tree)")
            #expect(Set(tree).count == tree.count, "\(uti): \(tree)")
            #expect(tree.contains("public.item"), "\(uti): \(tree)")
            let isFolder = uti == "public.folder", isPlainData = uti == "public.data" || uti == "public.zip-archive"
            #expect(tree.contains("public.content") == !(isFolder || isPlainData), "\(uti): \(tree)")
            for (index, member) in tree.enumerated() {
                for parent in UniformTypes.conformsTo[member] ?? [] {
                    // Depth first: a parent comes after its child.
                    #expect((tree.firstIndex(of: parent) ?? -1) > index, "\(uti): \(member) → \(parent) in \(tree)")
                }
            }
        }
        // Every type named as a parent is itself described (or a root).
        let roots: Set = ["public.item", "public.content", "public.archive"]
        for parent in Set(UniformTypes.conformsTo.values.joined()) {
            #expect(UniformTypes.conformsTo[parent] != nil || roots.contains(parent), "\(parent)")
        }
    }

    @Test func newKeysAreKnownByTheirAppleNames() {
        #expect(Query.canonicalName("NSMetadataItemURLKey") == "url")
        #expect(Query.canonicalName("NSMetadataItemDisplayNameKey") == "displayName")
        #expect(Query.canonicalName("NSMetadataItemContentTypeKey") == "contentType")
        #expect(Query.canonicalName("mimeType") == "mimeType")
        #expect(Query.canonicalName("NSMetadataItemContentTypeTreeKey") == "contentTypeTree")
        #expect(Query.canonicalName("kMDItemContentTypeTree") == "contentTypeTree")
    }
}
