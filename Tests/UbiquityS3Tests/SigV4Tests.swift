import Foundation
import Testing
import UbiquityS3

/// SigV4 signing checked against AWS's published vectors: the generic SigV4 test suite
/// and the S3 API Reference's header-signing examples.
@Suite struct SigV4Tests {
    // MARK: - The generic SigV4 test suite

    /// One request of AWS's SigV4 test suite, as the aws-c-auth copy of it has it
    /// (github.com/awslabs/aws-c-auth, tests/aws-signing-test-suite/v4/<name>/: request.txt,
    /// context.json, header-canonical-request.txt, header-signed-request.txt; commit 495329c2).
    /// Credentials AKIDEXAMPLE, us-east-1, service "service", 20150830T123600Z. Paths and query
    /// parameters are given unencoded, as the suite's request lines have them. The two
    /// form-urlencoded cases sign the body, so they send x-amz-content-sha256 themselves.
    /// post-sts-header-after (token added after signing) is left out: we always sign the token.
    struct Vector: Sendable, CustomTestStringConvertible {
        var name: String
        var method: String
        var path: String
        var query: [(String, String)]
        var headers: [(String, String)]
        var payloadHash = SigV4Signer.emptyPayloadHash
        var sessionToken: String? = nil
        var pathRule = SigV4Signer.PathRule.normalizedAndEncoded
        var canonicalRequest: String
        var authorization: String

        init(_ name: String, _ method: String, _ path: String, query: [(String, String)], headers: [(String, String)],
             payloadHash: String = SigV4Signer.emptyPayloadHash, sessionToken: String? = nil,
             pathRule: SigV4Signer.PathRule = .normalizedAndEncoded, canonicalRequest: String, authorization: String) {
            (self.name, self.method, self.path, self.query, self.headers) = (name, method, path, query, headers)
            (self.payloadHash, self.sessionToken, self.pathRule) = (payloadHash, sessionToken, pathRule)
            (self.canonicalRequest, self.authorization) = (canonicalRequest, authorization)
        }

        var testDescription: String { name }
    }

    static let suiteDate = Date(timeIntervalSince1970: 1_440_938_160)  // 20150830T123600Z

    static let suite: [Vector] = [
        Vector("get-header-key-duplicate", "GET", "/",
               query: [],
               headers: [("Host", "example.amazonaws.com"), ("My-Header1", "value2"), ("My-Header1", "value2"), ("My-Header1", "value1")],
               canonicalRequest: "GET\n/\n\nhost:example.amazonaws.com\nmy-header1:value2,value2,value1\nx-amz-date:20150830T123600Z\n\nhost;my-header1;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
               authorization: "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;my-header1;x-amz-date, Signature=c9d5ea9f3f72853aea855b47ea873832890dbdd183b4468f858259531a5138ea"),
        Vector("get-header-value-multiline", "GET", "/",
               query: [],
               headers: [("Host", "example.amazonaws.com"), ("My-Header1", "value1\n  value2\n     value3")],
               canonicalRequest: "GET\n/\n\nhost:example.amazonaws.com\nmy-header1:value1 value2 value3\nx-amz-date:20150830T123600Z\n\nhost;my-header1;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
               authorization: "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;my-header1;x-amz-date, Signature=cfd34249e4b1c8d6b91ef74165d41a32e5fab3306300901bb65a51a73575eefd"),
        Vector("get-header-value-order", "GET", "/",
               query: [],
               headers: [("Host", "example.amazonaws.com"), ("My-Header1", "value4"), ("My-Header1", "value1"), ("My-Header1", "value3"), ("My-Header1", "value2")],
               canonicalRequest: "GET\n/\n\nhost:example.amazonaws.com\nmy-header1:value4,value1,value3,value2\nx-amz-date:20150830T123600Z\n\nhost;my-header1;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
               authorization: "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;my-header1;x-amz-date, Signature=08c7e5a9acfcfeb3ab6b2185e75ce8b1deb5e634ec47601a50643f830c755c01"),
        Vector("get-header-value-trim", "GET", "/",
               query: [],
               headers: [("Host", "example.amazonaws.com"), ("My-Header1", " value1"), ("My-Header2", " \"a   b   c\"")],
               canonicalRequest: "GET\n/\n\nhost:example.amazonaws.com\nmy-header1:value1\nmy-header2:\"a b c\"\nx-amz-date:20150830T123600Z\n\nhost;my-header1;my-header2;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
               authorization: "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;my-header1;my-header2;x-amz-date, Signature=acc3ed3afb60bb290fc8d2dd0098b9911fcaa05412b367055dee359757a9c736"),
        Vector("get-relative-normalized", "GET", "/example/..",
               query: [],
               headers: [("Host", "example.amazonaws.com")],
               canonicalRequest: "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
               authorization: "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"),
        Vector("get-relative-relative-normalized", "GET", "/example1/example2/../..",
               query: [],
               headers: [("Host", "example.amazonaws.com")],
               canonicalRequest: "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
               authorization: "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"),
        Vector("get-relative-relative-unnormalized", "GET", "/example1/example2/../..",
               query: [],
               headers: [("Host", "example.amazonaws.com")],
               pathRule: .encoded,
               canonicalRequest: "GET\n/example1/example2/../..\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
               authorization: "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=dc33e0856fd4baca4d7aa2146c38958283844764f38c74252a333df5e613003b"),
        Vector("get-relative-unnormalized", "GET", "/example/..",
               query: [],
               headers: [("Host", "example.amazonaws.com")],
               pathRule: .encoded,
               canonicalRequest: "GET\n/example/..\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
               authorization: "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=eca7ead57bb5aa5c8e28007acd4ff04e1ff9a0ff3b237ec1554a184887ff9282"),
        Vector("get-slash-dot-slash-normalized", "GET", "/./",
               query: [],
               headers: [("Host", "example.amazonaws.com")],
               canonicalRequest: "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
               authorization: "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"),
        Vector("get-slash-dot-slash-unnormalized", "GET", "/./",
               query: [],
               headers: [("Host", "example.amazonaws.com")],
               pathRule: .encoded,
               canonicalRequest: "GET\n/./\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
               authorization: "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=68714168e6557f8f2de0ef956fc24dc2593a4bd2961f8df51898d8a134695145"),
        Vector("get-slash-normalized", "GET", "//",
               query: [],
               headers: [("Host", "example.amazonaws.com")],
               canonicalRequest: "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
               authorization: "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"),
        Vector("get-slash-pointless-dot-normalized", "GET", "/./example",
               query: [],
               headers: [("Host", "example.amazonaws.com")],
               canonicalRequest: "GET\n/example\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
               authorization: "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=ef75d96142cf21edca26f06005da7988e4f8dc83a165a80865db7089db637ec5"),
        Vector("get-slash-pointless-dot-unnormalized", "GET", "/./example",
               query: [],
               headers: [("Host", "example.amazonaws.com")],
               pathRule: .encoded,
               canonicalRequest: "GET\n/./example\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
               authorization: "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=beb03f223f7deae4146464f06e29eebbee9c8afbe15c290cf07aa8b119e14cff"),
        Vector("get-slash-unnormalized", "GET", "//",
               query: [],
               headers: [("Host", "example.amazonaws.com")],
               pathRule: .encoded,
               canonicalRequest: "GET\n//\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
               authorization: "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=c88bcd3d312d75078c0cd961d6deae3f4c754924b01669efcfcb439fd5e5b76e"),
        Vector("get-slashes-normalized", "GET", "//example//",
               query: [],
               headers: [("Host", "example.amazonaws.com")],
               canonicalRequest: "GET\n/example/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
               authorization: "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=9a624bd73a37c9a373b5312afbebe7a714a789de108f0bdfe846570885f57e84"),
        Vector("get-slashes-unnormalized", "GET", "//example//",
               query: [],
               headers: [("Host", "example.amazonaws.com")],
               pathRule: .encoded,
               canonicalRequest: "GET\n//example//\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
               authorization: "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=87cca117541a147f6df867677d98a7d80dff226d2bfca9e4ffa899665623c7e5"),
        Vector("get-space-normalized", "GET", "/example space/",
               query: [],
               headers: [("Host", "example.amazonaws.com")],
               canonicalRequest: "GET\n/example%20space/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
               authorization: "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=652487583200325589f1fba4c7e578f72c47cb61beeca81406b39ddec1366741"),
        Vector("get-space-unnormalized", "GET", "/example space/",
               query: [],
               headers: [("Host", "example.amazonaws.com")],
               pathRule: .encoded,
               canonicalRequest: "GET\n/example%20space/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
               authorization: "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=652487583200325589f1fba4c7e578f72c47cb61beeca81406b39ddec1366741"),
        Vector("get-unreserved", "GET", "/-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
               query: [],
               headers: [("Host", "example.amazonaws.com")],
               canonicalRequest: "GET\n/-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
               authorization: "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=07ef7494c76fa4850883e2b006601f940f8a34d404d0cfa977f52a65bbf5f24f"),
        Vector("get-utf8", "GET", "/\u{1234}",
               query: [],
               headers: [("Host", "example.amazonaws.com")],
               canonicalRequest: "GET\n/%E1%88%B4\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
               authorization: "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=8318018e0b0f223aa2bbf98705b62bb787dc9c0e678f255a891fd03141be5d85"),
        Vector("get-vanilla-empty-query-key", "GET", "/",
               query: [("Param1", "value1")],
               headers: [("Host", "example.amazonaws.com")],
               canonicalRequest: "GET\n/\nParam1=value1\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
               authorization: "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=a67d582fa61cc504c4bae71f336f98b97f1ea3c7a6bfe1b6e45aec72011b9aeb"),
        Vector("get-vanilla-query-order-encoded", "GET", "/",
               query: [("Param-3", "Value3"), ("Param", "Value2"), ("\u{1234}", "Value1")],
               headers: [("Host", "example.amazonaws.com")],
               canonicalRequest: "GET\n/\n%E1%88%B4=Value1&Param=Value2&Param-3=Value3\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
               authorization: "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=371d3713e185cc334048618a97f809c9ffe339c62934c032af5a0e595648fcac"),
        Vector("get-vanilla-query-order-key-case", "GET", "/",
               query: [("Param2", "value2"), ("Param1", "value1")],
               headers: [("Host", "example.amazonaws.com")],
               canonicalRequest: "GET\n/\nParam1=value1&Param2=value2\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
               authorization: "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500"),
        Vector("get-vanilla-query-unreserved", "GET", "/",
               query: [("-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz", "-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")],
               headers: [("Host", "example.amazonaws.com")],
               canonicalRequest: "GET\n/\n-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz=-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
               authorization: "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=9c3e54bfcdf0b19771a7f523ee5669cdf59bc7cc0884027167c21bb143a40197"),
        Vector("get-vanilla-query", "GET", "/",
               query: [],
               headers: [("Host", "example.amazonaws.com")],
               canonicalRequest: "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
               authorization: "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"),
        Vector("get-vanilla-utf8-query", "GET", "/",
               query: [("\u{1234}", "bar")],
               headers: [("Host", "example.amazonaws.com")],
               canonicalRequest: "GET\n/\n%E1%88%B4=bar\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
               authorization: "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=2cdec8eed098649ff3a119c94853b13c643bcf08f8b0a1d91e12c9027818dd04"),
        Vector("get-vanilla-with-session-token", "GET", "/",
               query: [],
               headers: [("Host", "example.amazonaws.com")],
               sessionToken: "6e86291e8372ff2a2260956d9b8aae1d763fbf315fa00fa31553b73ebf194267",
               canonicalRequest: "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\nx-amz-security-token:6e86291e8372ff2a2260956d9b8aae1d763fbf315fa00fa31553b73ebf194267\n\nhost;x-amz-date;x-amz-security-token\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
               authorization: "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date;x-amz-security-token, Signature=07ec1639c89043aa0e3e2de82b96708f198cceab042d4a97044c66dd9f74e7f8"),
        Vector("get-vanilla", "GET", "/",
               query: [],
               headers: [("Host", "example.amazonaws.com")],
               canonicalRequest: "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
               authorization: "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"),
        Vector("post-header-key-case", "POST", "/",
               query: [],
               headers: [("Host", "example.amazonaws.com")],
               canonicalRequest: "POST\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
               authorization: "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b"),
        Vector("post-header-key-sort", "POST", "/",
               query: [],
               headers: [("Host", "example.amazonaws.com"), ("My-Header1", "value1")],
               canonicalRequest: "POST\n/\n\nhost:example.amazonaws.com\nmy-header1:value1\nx-amz-date:20150830T123600Z\n\nhost;my-header1;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
               authorization: "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;my-header1;x-amz-date, Signature=c5410059b04c1ee005303aed430f6e6645f61f4dc9e1461ec8f8916fdf18852c"),
        Vector("post-header-value-case", "POST", "/",
               query: [],
               headers: [("Host", "example.amazonaws.com"), ("My-Header1", "VALUE1")],
               canonicalRequest: "POST\n/\n\nhost:example.amazonaws.com\nmy-header1:VALUE1\nx-amz-date:20150830T123600Z\n\nhost;my-header1;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
               authorization: "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;my-header1;x-amz-date, Signature=cdbc9802e29d2942e5e10b5bccfdd67c5f22c7c4e8ae67b53629efa58b974b7d"),
        Vector("post-sts-header-before", "POST", "/",
               query: [],
               headers: [("Host", "example.amazonaws.com")],
               sessionToken: "AQoDYXdzEPT//////////wEXAMPLEtc764bNrC9SAPBSM22wDOk4x4HIZ8j4FZTwdQWLWsKWHGBuFqwAeMicRXmxfpSPfIeoIYRqTflfKD8YUuwthAx7mSEI/qkPpKPi/kMcGdQrmGdeehM4IC1NtBmUpp2wUE8phUZampKsburEDy0KPkyQDYwT7WZ0wq5VSXDvp75YU9HFvlRd8Tx6q6fE8YQcHNVXAkiY9q6d+xo0rKwT38xVqr7ZD0u0iPPkUL64lIZbqBAz+scqKmlzm8FDrypNC9Yjc8fPOLn9FX9KSYvKTr4rvx3iSIlTJabIQwj2ICCR/oLxBA==",
               canonicalRequest: "POST\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\nx-amz-security-token:AQoDYXdzEPT//////////wEXAMPLEtc764bNrC9SAPBSM22wDOk4x4HIZ8j4FZTwdQWLWsKWHGBuFqwAeMicRXmxfpSPfIeoIYRqTflfKD8YUuwthAx7mSEI/qkPpKPi/kMcGdQrmGdeehM4IC1NtBmUpp2wUE8phUZampKsburEDy0KPkyQDYwT7WZ0wq5VSXDvp75YU9HFvlRd8Tx6q6fE8YQcHNVXAkiY9q6d+xo0rKwT38xVqr7ZD0u0iPPkUL64lIZbqBAz+scqKmlzm8FDrypNC9Yjc8fPOLn9FX9KSYvKTr4rvx3iSIlTJabIQwj2ICCR/oLxBA==\n\nhost;x-amz-date;x-amz-security-token\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
               authorization: "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date;x-amz-security-token, Signature=85d96828115b5dc0cfc3bd16ad9e210dd772bbebba041836c64533a82be05ead"),
        Vector("post-vanilla-empty-query-value", "POST", "/",
               query: [("Param1", "value1")],
               headers: [("Host", "example.amazonaws.com")],
               canonicalRequest: "POST\n/\nParam1=value1\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
               authorization: "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=28038455d6de14eafc1f9222cf5aa6f1a96197d7deb8263271d420d138af7f11"),
        Vector("post-vanilla-query", "POST", "/",
               query: [("Param1", "value1")],
               headers: [("Host", "example.amazonaws.com")],
               canonicalRequest: "POST\n/\nParam1=value1\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
               authorization: "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=28038455d6de14eafc1f9222cf5aa6f1a96197d7deb8263271d420d138af7f11"),
        Vector("post-vanilla", "POST", "/",
               query: [],
               headers: [("Host", "example.amazonaws.com")],
               canonicalRequest: "POST\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
               authorization: "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b"),
        Vector("post-x-www-form-urlencoded-parameters", "POST", "/",
               query: [],
               headers: [("Content-Type", "application/x-www-form-urlencoded; charset=utf-8"), ("Host", "example.amazonaws.com"), ("Content-Length", "13"), ("x-amz-content-sha256", "9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e")],
               payloadHash: "9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e",
               canonicalRequest: "POST\n/\n\ncontent-length:13\ncontent-type:application/x-www-form-urlencoded; charset=utf-8\nhost:example.amazonaws.com\nx-amz-content-sha256:9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e\nx-amz-date:20150830T123600Z\n\ncontent-length;content-type;host;x-amz-content-sha256;x-amz-date\n9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e",
               authorization: "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=content-length;content-type;host;x-amz-content-sha256;x-amz-date, Signature=328d1b9eaadca9f5818ef05e8392801e091653bafec24fcab71e7344e7f51422"),
        Vector("post-x-www-form-urlencoded", "POST", "/",
               query: [],
               headers: [("Content-Type", "application/x-www-form-urlencoded"), ("Host", "example.amazonaws.com"), ("Content-Length", "13"), ("x-amz-content-sha256", "9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e")],
               payloadHash: "9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e",
               canonicalRequest: "POST\n/\n\ncontent-length:13\ncontent-type:application/x-www-form-urlencoded\nhost:example.amazonaws.com\nx-amz-content-sha256:9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e\nx-amz-date:20150830T123600Z\n\ncontent-length;content-type;host;x-amz-content-sha256;x-amz-date\n9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e",
               authorization: "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=content-length;content-type;host;x-amz-content-sha256;x-amz-date, Signature=d3875051da38690788ef43de4db0d8f280229d82040bfac253562e56c3f20e0b"),
    ]

    @Test(arguments: suite) func theGenericTestSuite(_ v: Vector) {
        let credentials = AWSCredentials(accessKeyID: "AKIDEXAMPLE", secretAccessKey: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
                                         sessionToken: v.sessionToken, source: "test")
        let signer = SigV4Signer(credentials: credentials, region: "us-east-1", service: "service", pathRule: v.pathRule)
        let canonical = signer.canonicalRequest(method: v.method, path: v.path, query: v.query, headers: v.headers,
                                                payloadHash: v.payloadHash, date: Self.suiteDate)
        #expect(canonical == v.canonicalRequest)
        let added = signer.sign(method: v.method, path: v.path, query: v.query, headers: v.headers,
                                payloadHash: v.payloadHash, date: Self.suiteDate)
        var expected = [("x-amz-date", "20150830T123600Z")]
        if let token = v.sessionToken { expected.append(("x-amz-security-token", token)) }
        expected.append(("authorization", v.authorization))
        #expect(added.map(\.0) == expected.map(\.0))
        #expect(added.map(\.1) == expected.map(\.1))
    }

    @Test func theSuiteCoversWhatItShould() {
        let names = Set(Self.suite.map(\.name))
        #expect(names.count == Self.suite.count)
        for name in ["get-vanilla", "get-vanilla-query-order-key-case", "get-vanilla-query-unreserved",
                     "get-vanilla-utf8-query", "get-header-key-duplicate", "get-header-value-trim",
                     "get-header-value-multiline", "post-vanilla", "post-x-www-form-urlencoded",
                     "post-sts-header-before", "get-vanilla-with-session-token", "get-relative-relative-normalized",
                     "get-space-normalized", "get-slash-normalized", "get-slashes-unnormalized", "get-utf8"] {
            #expect(names.contains(name), "\(name)")
        }
    }

    /// The default path rule of other services is the normalizing one.
    @Test func otherServicesNormalizeAndEncodeByDefault() {
        let credentials = AWSCredentials(accessKeyID: "AKIDEXAMPLE", secretAccessKey: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
                                         source: "test")
        let signer = SigV4Signer(credentials: credentials, region: "us-east-1", service: "service")
        let added = signer.sign(method: "GET", path: "/example1/example2/../..", query: [],
                                headers: [("Host", "example.amazonaws.com")],
                                payloadHash: SigV4Signer.emptyPayloadHash, date: Self.suiteDate)
        #expect(added.last?.1 == "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
            + "SignedHeaders=host;x-amz-date, Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31")
    }

    // MARK: - The S3 examples

    /// Amazon S3 API Reference, "Signature Calculations for the Authorization Header: Transferring
    /// Payload in a Single Chunk (AWS Signature Version 4)", examples GET Object, PUT Object,
    /// GET Bucket Lifecycle and GET Bucket (List Objects).
    static let s3 = SigV4Signer(
        credentials: AWSCredentials(accessKeyID: "AKIAIOSFODNN7EXAMPLE",
                                    secretAccessKey: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", source: "test"),
        region: "us-east-1", service: "s3")
    static let s3Date = Date(timeIntervalSince1970: 1_369_353_600)  // 20130524T000000Z
    static let host = ("host", "examplebucket.s3.amazonaws.com")

    static func s3Authorization(signedHeaders: String, signature: String) -> String {
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
            + "SignedHeaders=\(signedHeaders), Signature=\(signature)"
    }

    @Test func s3GetObjectWithRange() {
        let added = Self.s3.sign(method: "GET", path: "/test.txt", query: [], headers: [Self.host, ("Range", "bytes=0-9")],
                                 payloadHash: SigV4Signer.emptyPayloadHash, date: Self.s3Date)
        #expect(added.map(\.0) == ["x-amz-date", "x-amz-content-sha256", "authorization"])
        #expect(added.map(\.1) == [
            "20130524T000000Z", SigV4Signer.emptyPayloadHash,
            Self.s3Authorization(signedHeaders: "host;range;x-amz-content-sha256;x-amz-date",
                                 signature: "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"),
        ])
        let canonical = Self.s3.canonicalRequest(method: "GET", path: "/test.txt", query: [],
                                                 headers: [Self.host, ("Range", "bytes=0-9")],
                                                 payloadHash: SigV4Signer.emptyPayloadHash, date: Self.s3Date)
        #expect(canonical == """
            GET
            /test.txt

            host:examplebucket.s3.amazonaws.com
            range:bytes=0-9
            x-amz-content-sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855
            x-amz-date:20130524T000000Z

            host;range;x-amz-content-sha256;x-amz-date
            e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855
            """)
    }

    @Test func s3PutObject() {
        let body = SigV4Signer.sha256Hex(Data("Welcome to Amazon S3.".utf8))
        #expect(body == "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072")
        let path = SigV4Signer.uriEncode("/test$file.text", encodeSlash: false)
        #expect(path == "/test%24file.text")
        let added = Self.s3.sign(method: "PUT", path: path, query: [],
                                 headers: [("Date", "Fri, 24 May 2013 00:00:00 GMT"), Self.host,
                                           ("x-amz-storage-class", "REDUCED_REDUNDANCY")],
                                 payloadHash: body, date: Self.s3Date)
        #expect(added.map(\.1) == [
            "20130524T000000Z", body,
            Self.s3Authorization(signedHeaders: "date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class",
                                 signature: "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd"),
        ])
    }

    @Test func s3GetBucketLifecycle() {
        #expect(SigV4Signer.canonicalQueryString([("lifecycle", "")]) == "lifecycle=")
        let added = Self.s3.sign(method: "GET", path: "/", query: [("lifecycle", "")], headers: [Self.host],
                                 payloadHash: SigV4Signer.emptyPayloadHash, date: Self.s3Date)
        #expect(added.last?.1 == Self.s3Authorization(
            signedHeaders: "host;x-amz-content-sha256;x-amz-date",
            signature: "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543"))
    }

    @Test func s3ListObjects() {
        let query = [("prefix", "J"), ("max-keys", "2")]
        #expect(SigV4Signer.canonicalQueryString(query) == "max-keys=2&prefix=J")
        let added = Self.s3.sign(method: "GET", path: "/", query: query, headers: [Self.host],
                                 payloadHash: SigV4Signer.emptyPayloadHash, date: Self.s3Date)
        #expect(added.last?.1 == Self.s3Authorization(
            signedHeaders: "host;x-amz-content-sha256;x-amz-date",
            signature: "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"))
    }

    /// S3 signs the path as sent: no normalization and no second encoding.
    @Test func s3KeepsThePathAsSent() {
        let canonical = Self.s3.canonicalRequest(method: "GET", path: "/a/./b//c%20d/../e", query: [], headers: [Self.host],
                                                 payloadHash: SigV4Signer.unsignedPayload, date: Self.s3Date)
        #expect(canonical.split(separator: "\n", omittingEmptySubsequences: false)[1] == "/a/./b//c%20d/../e")
        #expect(canonical.hasSuffix("\nUNSIGNED-PAYLOAD"))
    }

    /// Headers the signer adds replace the caller's of the same name, and a session token is signed.
    @Test func addedHeadersReplaceTheCallersAndTheTokenIsSigned() {
        var signer = Self.s3
        signer.credentials.sessionToken = "TOKEN"
        let added = signer.sign(method: "GET", path: "/k", query: [],
                                headers: [Self.host, ("X-Amz-Date", "19990101T000000Z"), ("Authorization", "old"),
                                          ("x-amz-content-sha256", "stale")],
                                payloadHash: SigV4Signer.emptyPayloadHash, date: Self.s3Date)
        #expect(added.map(\.0) == ["x-amz-date", "x-amz-security-token", "x-amz-content-sha256", "authorization"])
        #expect(added[0].1 == "20130524T000000Z")
        #expect(added[1].1 == "TOKEN")
        #expect(added[2].1 == SigV4Signer.emptyPayloadHash)
        #expect(added[3].1.contains("SignedHeaders=host;x-amz-content-sha256;x-amz-date;x-amz-security-token, "))
    }

    // MARK: - Pieces

    @Test func headerValuesAreTrimmedAndFoldedLinesJoined() {
        let canonical = Self.s3.canonicalRequest(method: "GET", path: "/", query: [],
                                                 headers: [Self.host, ("X-Meta", " a\r\n  b\t\tc  d\n e ")],
                                                 payloadHash: SigV4Signer.unsignedPayload, date: Self.s3Date)
        #expect(canonical.contains("\nx-meta:a b c d e\n"))
    }

    @Test func uriEncoding() {
        let unreserved = "-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
        #expect(SigV4Signer.uriEncode(unreserved, encodeSlash: true) == unreserved)
        #expect(SigV4Signer.uriEncode("a b/c+d=e&f%g*h", encodeSlash: true) == "a%20b%2Fc%2Bd%3De%26f%25g%2Ah")
        #expect(SigV4Signer.uriEncode("/a b/ü", encodeSlash: false) == "/a%20b/%C3%BC")
        #expect(SigV4Signer.uriEncode("\u{1234}", encodeSlash: false) == "%E1%88%B4")
    }

    @Test func queryStringsSortByEncodedNameThenValue() {
        let query = [("b", "2"), ("a b", "x/y"), ("B", "1"), ("b", "1"), ("a", "")]
        #expect(SigV4Signer.canonicalQueryString(query) == "B=1&a=&a%20b=x%2Fy&b=1&b=2")
        #expect(SigV4Signer.canonicalQueryString([]) == "")
        #expect(SigV4Signer.canonicalQueryString([("list-type", "2"), ("continuation-token", "1/+=")])
            == "continuation-token=1%2F%2B%3D&list-type=2")
    }

    @Test func datesAreUTC() {
        #expect(SigV4Signer.amzDate(Date(timeIntervalSince1970: 0)) == "19700101T000000Z")
        #expect(SigV4Signer.amzDate(Self.suiteDate) == "20150830T123600Z")
        #expect(SigV4Signer.amzDate(Self.s3Date) == "20130524T000000Z")
        #expect(SigV4Signer.amzDate(Date(timeIntervalSince1970: 1_709_251_199.9)) == "20240229T235959Z")
    }
}
