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

    @Test func treesAreTheTypeAndItsParents() {
        #expect(UniformTypes.tree(of: "public.jpeg") == ["public.jpeg", "public.image", "public.data", "public.item", "public.content"])
        #expect(UniformTypes.tree(of: "net.daringfireball.markdown")
                == ["net.daringfireball.markdown", "public.plain-text", "public.text", "public.data", "public.item", "public.content"])
        #expect(UniformTypes.tree(of: "public.folder") == ["public.folder", "public.directory", "public.item"])
        #expect(UniformTypes.tree(of: "public.data") == ["public.data", "public.item", "public.content"])
        // Every identifier of the table has a tree that ends at public.item (and content, for files).
        for uti in Set(UniformTypes.byMIME.values) {
            let tree = UniformTypes.tree(of: uti)
            #expect(tree.first == uti && tree.contains("public.item"), "\(uti): \(tree)")
        }
    }

    @Test func newKeysAreKnownByTheirAppleNames() {
        #expect(Query.canonicalName("NSMetadataItemURLKey") == "url")
        #expect(Query.canonicalName("NSMetadataItemDisplayNameKey") == "displayName")
        #expect(Query.canonicalName("NSMetadataItemContentTypeKey") == "contentType")
        #expect(Query.canonicalName("mimeType") == "mimeType")
    }
}
