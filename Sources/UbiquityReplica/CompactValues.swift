import UbiquityModel

/// Node IDs and content hashes as the namespace keeps them: a canonical
/// UUID in its 16 bytes, a canonical SHA-256 name in its 32 bytes, and
/// anything else as the text it came as. The text form round-trips
/// exactly: a canonical value formats back to the same characters (only
/// the canonical spelling is packed), any other value is kept as it is.
/// (IDs are UUIDs except the root's `"root"` and well-known folder IDs;
/// hashes are 64 lower-case hex digits once they pass the store's
/// validation, but nothing here relies on it.)

/// A node ID: a lower-case 8-4-4-4-12 UUID packed into two words, or other text.
enum StoredID: Hashable, Sendable {
    case uuid(UInt64, UInt64)
    case text(String)

    init(_ id: NodeID) {
        if let (high, low) = Hex.uuid(id) { self = .uuid(high, low) } else { self = .text(id) }
    }

    var string: NodeID {
        switch self {
        case .uuid(let high, let low): return NodeID.uuid(high, low)
        case .text(let text): return text
        }
    }
}

/// A content hash: 64 lower-case hex digits packed into four words
/// (big-endian, so the words compare as the text does), or other text.
enum StoredHash: Hashable, Sendable {
    case sha256(UInt64, UInt64, UInt64, UInt64)
    case text(String)

    init(_ hash: String) {
        if let w = Hex.sha256(hash) { self = .sha256(w.0, w.1, w.2, w.3) } else { self = .text(hash) }
    }

    var string: String {
        switch self {
        case .sha256(let a, let b, let c, let d): return Hex.sha256String(a, b, c, d)
        case .text(let text): return text
        }
    }
}

/// Parsing and formatting of lower-case hex (only lower case is canonical).
enum Hex {
    @inline(__always)
    static func digit(_ c: UInt8) -> UInt64? {
        switch c {
        case 0x30...0x39: return UInt64(c - 0x30)
        case 0x61...0x66: return UInt64(c - 0x61 + 10)
        default: return nil
        }
    }

    static let digits: [UInt8] = Array("0123456789abcdef".utf8)

    /// The two words of a canonical UUID text, or nil.
    static func uuid(_ text: String) -> (UInt64, UInt64)? {
        var text = text
        return text.withUTF8 { bytes -> (UInt64, UInt64)? in
            guard bytes.count == 36 else { return nil }
            var words: (UInt64, UInt64) = (0, 0)
            var nibbles = 0
            for (i, c) in bytes.enumerated() {
                if i == 8 || i == 13 || i == 18 || i == 23 {
                    guard c == 0x2d else { return nil }
                    continue
                }
                guard let d = digit(c) else { return nil }
                if nibbles < 16 { words.0 = words.0 << 4 | d } else { words.1 = words.1 << 4 | d }
                nibbles += 1
            }
            return words
        }
    }

    /// The four words of 64 lower-case hex digits, or nil.
    static func sha256(_ text: String) -> (UInt64, UInt64, UInt64, UInt64)? {
        var text = text
        return text.withUTF8 { bytes -> (UInt64, UInt64, UInt64, UInt64)? in
            guard bytes.count == 64 else { return nil }
            var a: UInt64 = 0, b: UInt64 = 0, c: UInt64 = 0, d: UInt64 = 0
            for i in 0..<16 {
                guard let x = digit(bytes[i]), let y = digit(bytes[16 + i]),
                      let z = digit(bytes[32 + i]), let w = digit(bytes[48 + i]) else { return nil }
                a = a << 4 | x; b = b << 4 | y; c = c << 4 | z; d = d << 4 | w
            }
            return (a, b, c, d)
        }
    }

    static func sha256String(_ a: UInt64, _ b: UInt64, _ c: UInt64, _ d: UInt64) -> String {
        String(unsafeUninitializedCapacity: 64) { out in
            digits.withUnsafeBufferPointer { digits in
                for nibble in 0..<16 {
                    let shift = UInt64(60 - 4 * nibble)
                    out[nibble] = digits[Int((a >> shift) & 0xF)]
                    out[16 + nibble] = digits[Int((b >> shift) & 0xF)]
                    out[32 + nibble] = digits[Int((c >> shift) & 0xF)]
                    out[48 + nibble] = digits[Int((d >> shift) & 0xF)]
                }
                return 64
            }
        }
    }
}
