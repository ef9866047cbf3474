import Foundation

/// Case and diacritic folding for `[c]`, `[d]`, `[cd]`.
///
/// The meaning is `String.folding(options:locale:)` with no locale. Two fast
/// paths give the same result without Foundation's per-call cost: ASCII text
/// (diacritic folding does nothing, case folding is lower-casing), and text
/// whose scalars are all below U+0250 (ASCII and the Latin blocks, which hold no
/// combining marks), folded scalar by scalar from a table that is itself built
/// by `folding(options:locale:)` one scalar at a time.
struct StringFolder: Sendable {
    let options: ComparisonOptions

    var isIdentity: Bool { options.isEmpty }

    func fold(_ s: String) -> String {
        if options.isEmpty { return s }
        if s.utf8.allSatisfy({ $0 < 0x80 }) {
            return options.contains(.caseInsensitive) ? s.lowercased() : s
        }
        let table = Self.latinTables[Int(options.rawValue)]
        var bytes: [UInt8] = []
        bytes.reserveCapacity(s.utf8.count + 8)
        for scalar in s.unicodeScalars {
            guard scalar.value < Self.latinLimit else { return foundationFold(s) }
            bytes.append(contentsOf: table[Int(scalar.value)])
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// The reference: Foundation's folding of the whole string.
    func foundationFold(_ s: String) -> String {
        var foundationOptions: String.CompareOptions = []
        if options.contains(.caseInsensitive) { foundationOptions.insert(.caseInsensitive) }
        if options.contains(.diacriticInsensitive) { foundationOptions.insert(.diacriticInsensitive) }
        return s.folding(options: foundationOptions, locale: nil)
    }

    static let latinLimit: UInt32 = 0x250

    /// For each option set (by raw value), the folded UTF-8 of every scalar below `latinLimit`.
    static let latinTables: [[[UInt8]]] = (0...3).map { raw in
        guard raw != 0 else { return [] }
        let folder = StringFolder(options: ComparisonOptions(rawValue: UInt8(raw)))
        return (0..<latinLimit).map { value in
            Array(folder.foundationFold(String(Unicode.Scalar(value)!)).utf8)
        }
    }
}

/// A compiled wildcard pattern: LIKE's `*` and `?`, and BEGINSWITH / ENDSWITH /
/// CONTAINS as patterns without wildcards. Matches the whole string.
///
/// The pattern is split at `*` into fixed-length segments, matched as: first
/// segment anchored at the start, last anchored at the end, the ones between
/// at their leftmost place (which is exact for fixed-length segments). `?` is one
/// character (grapheme cluster).
///
/// Characters are compared after folding, as `Character`s. Two fast paths give
/// the same answers without building a `[Character]`: ASCII subjects are matched
/// on their bytes (lower-cased on the fly for `[c]`), and folded subjects whose
/// scalars are all below U+0250 on their scalars, since there every scalar is a
/// character of its own and no two scalars are canonically equivalent.
/// (CR is left out of both: CR LF is one character.)
struct WildcardPattern: Sendable {
    /// Segments between stars; `nil` elements are `?`. One segment means no star.
    private let segments: [[Character?]]
    /// The same segments as bytes, when every literal character is ASCII.
    private let byteSegments: [[UInt8?]]?
    /// The same segments as scalars, when every literal character is one scalar below U+0250.
    private let scalarSegments: [[UInt32?]]?
    private let folder: StringFolder

    /// LIKE: `*` any sequence, `?` one character, `\` makes the next character literal.
    init(like pattern: String, options: ComparisonOptions) {
        let folder = StringFolder(options: options)
        var segments: [[Character?]] = [[]]
        var escaped = false
        for c in folder.fold(pattern) {
            if escaped {
                segments[segments.count - 1].append(c)
                escaped = false
            } else if c == "\\" {
                escaped = true
            } else if c == "*" {
                segments.append([])
            } else if c == "?" {
                segments[segments.count - 1].append(nil)
            } else {
                segments[segments.count - 1].append(c)
            }
        }
        if escaped { segments[segments.count - 1].append("\\") }
        self.init(segments: segments, folder: folder)
    }

    /// BEGINSWITH, ENDSWITH, CONTAINS: `literal*`, `*literal`, `*literal*` without wildcards.
    init(_ op: ComparisonOperator, literal: String, options: ComparisonOptions) {
        let folder = StringFolder(options: options)
        let chars: [Character?] = folder.fold(literal).map { $0 }
        switch op {
        case .beginsWith: self.init(segments: [chars, []], folder: folder)
        case .endsWith: self.init(segments: [[], chars], folder: folder)
        default: self.init(segments: [[], chars, []], folder: folder)
        }
    }

    private init(segments: [[Character?]], folder: StringFolder) {
        // Empty segments between stars (`a**b`) change nothing.
        var kept = segments
        if kept.count > 2 {
            kept = [kept[0]] + kept[1..<(kept.count - 1)].filter { !$0.isEmpty } + [kept[kept.count - 1]]
        }
        self.segments = kept
        self.folder = folder
        byteSegments = Self.convert(kept) { c in
            c.unicodeScalars.count == 1 && c.unicodeScalars.first!.value < 0x80 ? UInt8(c.unicodeScalars.first!.value) : nil
        }
        scalarSegments = Self.convert(kept) { c in
            c.unicodeScalars.count == 1 ? Self.simpleScalar(c.unicodeScalars.first!.value) : nil
        }
    }

    /// A scalar that is always a character of its own, or nil.
    @inline(__always)
    private static func simpleScalar(_ value: UInt32) -> UInt32? {
        value < StringFolder.latinLimit && value != 0x0D ? value : nil
    }

    private static func convert<T>(_ segments: [[Character?]], _ element: (Character) -> T?) -> [[T?]]? {
        var result: [[T?]] = []
        for segment in segments {
            var converted: [T?] = []
            for c in segment {
                guard let c else {
                    converted.append(nil)
                    continue
                }
                guard let e = element(c) else { return nil }
                converted.append(e)
            }
            result.append(converted)
        }
        return result
    }

    func matches(_ subject: String) -> Bool {
        if let byteSegments {
            let fast: Bool? = subject.utf8.withContiguousStorageIfAvailable { buffer in
                guard buffer.allSatisfy({ $0 < 0x80 && $0 != 0x0D }) else { return nil }
                let view = ASCIIView(base: buffer, lowercase: folder.options.contains(.caseInsensitive))
                return Self.match(byteSegments, view)
            } ?? nil
            if let fast { return fast }
        }
        let folded = folder.fold(subject)
        if let scalarSegments {
            let capacity = folded.utf8.count
            let fast: Bool? = withUnsafeTemporaryAllocation(of: UInt32.self, capacity: max(capacity, 1)) { buffer in
                var count = 0
                for scalar in folded.unicodeScalars {
                    guard let value = Self.simpleScalar(scalar.value) else { return nil }
                    buffer[count] = value
                    count += 1
                }
                return Self.match(scalarSegments, UnsafeBufferPointer(rebasing: buffer[0..<count]))
            }
            if let fast { return fast }
        }
        return Self.match(segments, Array(folded))
    }

    private static func match<C: RandomAccessCollection>(_ segments: [[C.Element?]], _ s: C) -> Bool
    where C.Index == Int, C.Element: Equatable {
        let count = s.count
        let first = segments[0]
        if segments.count == 1 {
            return count == first.count && matchSegment(first, s, at: 0)
        }
        let last = segments[segments.count - 1]
        guard count >= first.count + last.count,
              matchSegment(first, s, at: 0),
              matchSegment(last, s, at: count - last.count)
        else { return false }
        var position = first.count
        let end = count - last.count
        for index in 1..<(segments.count - 1) {
            let segment = segments[index]
            var found = false
            while position + segment.count <= end {
                if matchSegment(segment, s, at: position) {
                    found = true
                    break
                }
                position += 1
            }
            if !found { return false }
            position += segment.count
        }
        return true
    }

    @inline(__always)
    private static func matchSegment<C: RandomAccessCollection>(_ segment: [C.Element?], _ s: C, at start: Int) -> Bool
    where C.Index == Int, C.Element: Equatable {
        var i = start
        for element in segment {
            if let element, s[i] != element { return false }
            i += 1
        }
        return true
    }
}

/// ASCII bytes, optionally lower-cased on the fly.
private struct ASCIIView: RandomAccessCollection {
    let base: UnsafeBufferPointer<UInt8>
    let lowercase: Bool

    var startIndex: Int { 0 }
    var endIndex: Int { base.count }

    subscript(position: Int) -> UInt8 {
        let byte = base[position]
        return lowercase && byte >= 0x41 && byte <= 0x5A ? byte | 0x20 : byte
    }
}
