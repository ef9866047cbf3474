/// AWS credentials and region, found the way the AWS CLI and SDKs find static ones, from
/// AWS's "Shared config and credentials files" and "Environment variables" pages of the AWS SDKs and
/// Tools Reference Guide:
///   1. AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN (skipped when a profile is named
///      explicitly, as botocore does for --profile; AWS_PROFILE does not skip them);
///   2. the profile (argument, else AWS_PROFILE, else "default") in the shared credentials file
///      (AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/credentials, section [name]) and the config file
///      (AWS_CONFIG_FILE, else ~/.aws/config, section [profile name], or [default]); for the same key
///      the credentials file wins.
/// Not implemented: SSO, assume-role (role_arn/source_profile), credential_process, web identity,
/// container and instance metadata credentials.
import Foundation
import UbiquityModel
import UbiquityLinux
#if canImport(Glibc)
import Glibc
#endif

public struct AWSCredentials: Sendable, Equatable, CustomStringConvertible, CustomDebugStringConvertible {
    public var accessKeyID: String
    public var secretAccessKey: String
    public var sessionToken: String?
    /// Where they came from, for messages ("environment", "profile dev in /home/u/.aws/credentials"); never the secret.
    public var source: String

    public init(accessKeyID: String, secretAccessKey: String, sessionToken: String? = nil, source: String) {
        self.accessKeyID = accessKeyID
        self.secretAccessKey = secretAccessKey
        self.sessionToken = sessionToken
        self.source = source
    }

    /// Names the key and where it came from; never the secret or the token.
    public var description: String {
        "AWS credentials \(accessKeyID)\(sessionToken == nil ? "" : " (temporary)") from \(source)"
    }

    public var debugDescription: String { description }

    /// Environment credentials unless `profile` is given, else the profile's (see the file comment).
    /// Throws `UbiquityError` ENOENT when nothing is found or a named profile does not exist, EACCES
    /// when credentials are incomplete or a file can't be read; messages name the profile and files, never a secret.
    public static func resolve(profile: String?, environment: [String: String], home: String) throws -> AWSCredentials {
        let env = environment.compactMapValues(nonEmpty)
        if profile == nil {
            switch (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]) {
            case let (id?, secret?):
                return AWSCredentials(accessKeyID: id, secretAccessKey: secret,
                                      sessionToken: env["AWS_SESSION_TOKEN"], source: "environment")
            case (_?, nil):
                throw UbiquityError(EACCES, "AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not")
            case (nil, _?):
                throw UbiquityError(EACCES, "AWS_SECRET_ACCESS_KEY is set but AWS_ACCESS_KEY_ID is not")
            case (nil, nil):
                break
            }
        }
        let name = profileName(profile, env)
        let files = Files(environment: env, home: home)
        let fromCredentials = try files.credentialsSection(name)
        let fromConfig = try files.configSection(name)
        let properties = (fromConfig ?? [:]).merging(fromCredentials ?? [:]) { _, credentialsFile in credentialsFile }
        let looked = "looked in \(files.credentials) [\(name)] and \(files.config) [\(configSectionName(name))]"

        guard fromCredentials != nil || fromConfig != nil else {
            if profile != nil || env["AWS_PROFILE"] != nil {
                throw UbiquityError(ENOENT, "AWS profile \(name) not found; \(looked)")
            }
            throw UbiquityError(ENOENT, "no AWS credentials: AWS_ACCESS_KEY_ID is not set and there is no "
                                + "profile \(name); \(looked)")
        }
        guard let id = properties["aws_access_key_id"], let secret = properties["aws_secret_access_key"] else {
            let missing = ["aws_access_key_id", "aws_secret_access_key"].filter { properties[$0] == nil }
            throw UbiquityError(EACCES, "AWS profile \(name) has no \(missing.joined(separator: " or ")); \(looked)")
        }
        let file = fromCredentials?["aws_access_key_id"] != nil ? files.credentials : files.config
        return AWSCredentials(accessKeyID: id, secretAccessKey: secret, sessionToken: properties["aws_session_token"],
                              source: "profile \(name) in \(file)")
    }

    /// AWS_REGION, else AWS_DEFAULT_REGION, else `region` in the profile's config file section, else nil.
    public static func region(profile: String?, environment: [String: String], home: String) -> String? {
        let env = environment.compactMapValues(nonEmpty)
        if let region = env["AWS_REGION"] ?? env["AWS_DEFAULT_REGION"] { return region }
        let files = Files(environment: env, home: home)
        return (try? files.configSection(profileName(profile, env)))??["region"]
    }

    /// `value` trimmed, or nil when that leaves nothing.
    private static func nonEmpty(_ value: String) -> String? {
        let trimmed = value.trimmingCharacters(in: .whitespaces)
        return trimmed.isEmpty ? nil : trimmed
    }

    private static func profileName(_ profile: String?, _ env: [String: String]) -> String {
        profile ?? env["AWS_PROFILE"] ?? "default"
    }

    private static func configSectionName(_ profile: String) -> String {
        profile == "default" ? "default" : "profile \(profile)"
    }

    /// The two files, from the environment or under `home`.
    private struct Files {
        var credentials: String
        var config: String

        init(environment: [String: String], home: String) {
            func expand(_ path: String) -> String { path.hasPrefix("~/") ? home + path.dropFirst() : path }
            credentials = expand(environment["AWS_SHARED_CREDENTIALS_FILE"] ?? "~/.aws/credentials")
            config = expand(environment["AWS_CONFIG_FILE"] ?? "~/.aws/config")
        }

        func credentialsSection(_ profile: String) throws -> [String: String]? {
            try AWSCredentials.read(credentials)[profile]
        }

        /// [profile name]; for "default", [default] and [profile default], [default] winning for the same key.
        func configSection(_ profile: String) throws -> [String: String]? {
            let sections = try AWSCredentials.read(config)
            let plain = profile == "default" ? sections["default"] : nil
            switch (sections["profile \(profile)"], plain) {
            case (nil, nil): return nil
            case let (prefixed, plain): return (prefixed ?? [:]).merging(plain ?? [:]) { _, plain in plain }
            }
        }
    }

    /// The sections of an INI file (nothing when it does not exist); EACCES when it can't be read.
    static func read(_ path: String) throws -> [String: [String: String]] {
        do {
            return parse(String(decoding: try LinuxCalls.readWhole(path), as: UTF8.self))
        } catch let error as UbiquityError where error.errno == ENOENT || error.errno == ENOTDIR {
            return [:]
        } catch {
            throw UbiquityError(EACCES, "cannot read AWS file: \(UbiquityError.wrap(error))")
        }
    }

    /// The AWS INI dialect: `[section]`, `key = value` (keys lowercased), whole-line comments starting
    /// with # or ;, and inline comments after whitespace. A line indented deeper than the property
    /// before it continues that property (nested S3 settings); such lines are skipped. A repeated
    /// section adds to the earlier one; a repeated key replaces.
    static func parse(_ text: String) -> [String: [String: String]] {
        var sections: [String: [String: String]] = [:]
        var current: String?
        var propertyIndent: Int?
        for rawLine in text.split(omittingEmptySubsequences: true, whereSeparator: \.isNewline) {
            let indent = rawLine.prefix { $0 == " " || $0 == "\t" }.count
            let line = withoutComment(rawLine).trimmingCharacters(in: .whitespaces)
            if line.isEmpty { continue }
            if line.hasPrefix("[") {
                guard line.hasSuffix("]") else { current = nil; continue }
                let name = line.dropFirst().dropLast().split(whereSeparator: \.isWhitespace).joined(separator: " ")
                current = name
                if sections[name] == nil { sections[name] = [:] }
                propertyIndent = nil
                continue
            }
            guard let section = current else { continue }
            if let previous = propertyIndent, indent > previous { continue }
            guard let equals = line.firstIndex(of: "=") else { continue }
            let key = line[..<equals].trimmingCharacters(in: .whitespaces).lowercased()
            let value = line[line.index(after: equals)...].trimmingCharacters(in: .whitespaces)
            guard !key.isEmpty else { continue }
            propertyIndent = indent
            sections[section]![key] = nonEmpty(value)
        }
        return sections
    }

    /// `line` up to a comment: one starting the line, or a # or ; after whitespace.
    private static func withoutComment(_ line: Substring) -> Substring {
        let trimmed = line.drop { $0 == " " || $0 == "\t" }
        if trimmed.hasPrefix("#") || trimmed.hasPrefix(";") { return "" }
        var previous: Character = "x"
        for index in line.indices {
            let c = line[index]
            if (c == "#" || c == ";") && (previous == " " || previous == "\t") { return line[..<index] }
            previous = c
        }
        return line
    }
}
