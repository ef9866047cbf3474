import Foundation
import Testing
import UbiquityS3
import UbiquityModel
#if canImport(Glibc)
import Glibc
#endif

/// Credential and region resolution, the AWS way, in throwaway home folders.
@Suite struct AWSCredentialsTests {
    /// A temporary HOME with ~/.aws/credentials and ~/.aws/config written as given.
    final class Home {
        let path: String

        init(credentials: String? = nil, config: String? = nil) throws {
            path = FileManager.default.temporaryDirectory.appendingPathComponent("aws-home-\(UUID().uuidString)").path
            try FileManager.default.createDirectory(atPath: path + "/.aws", withIntermediateDirectories: true)
            if let credentials { try write(".aws/credentials", credentials) }
            if let config { try write(".aws/config", config) }
        }

        deinit { try? FileManager.default.removeItem(atPath: path) }

        func write(_ relative: String, _ text: String) throws {
            try Data(text.utf8).write(to: URL(fileURLWithPath: path + "/" + relative))
        }

        func resolve(_ profile: String? = nil, _ environment: [String: String] = [:]) throws -> AWSCredentials {
            try AWSCredentials.resolve(profile: profile, environment: environment, home: path)
        }

        func region(_ profile: String? = nil, _ environment: [String: String] = [:]) -> String? {
            AWSCredentials.region(profile: profile, environment: environment, home: path)
        }

        /// The error `resolve` throws (nil: it did not throw a UbiquityError).
        func failure(_ profile: String? = nil, _ environment: [String: String] = [:]) -> UbiquityError? {
            do {
                _ = try resolve(profile, environment)
                return nil
            } catch {
                return error as? UbiquityError
            }
        }
    }

    static let credentialsFile = """
        [default]
        aws_access_key_id = AKIDDEFAULT
        aws_secret_access_key = secretDefault/+1

        [dev]
        aws_access_key_id = AKIDDEV
        aws_secret_access_key = secretDev/+2
        aws_session_token = tokenDev==

        [half]
        aws_secret_access_key = secretHalf/+3
        """
    static let secrets = ["secretDefault/+1", "secretDev/+2", "tokenDev==", "secretHalf/+3", "secretEnv", "secretConfig"]

    static let environmentKeys = ["AWS_ACCESS_KEY_ID": "AKIDENV", "AWS_SECRET_ACCESS_KEY": "secretEnv"]

    @Test func theEnvironmentWins() throws {
        let home = try Home(credentials: Self.credentialsFile)
        let found = try home.resolve(nil, Self.environmentKeys.merging(["AWS_PROFILE": "dev"]) { a, _ in a })
        #expect(found == AWSCredentials(accessKeyID: "AKIDENV", secretAccessKey: "secretEnv", sessionToken: nil,
                                        source: "environment"))
        let withToken = try home.resolve(nil, Self.environmentKeys.merging(["AWS_SESSION_TOKEN": "tokenEnv"]) { a, _ in a })
        #expect(withToken.sessionToken == "tokenEnv")
    }

    /// As botocore does for --profile: a profile named by the caller is used even when the environment has keys.
    @Test func aProfileNamedByTheCallerOutranksTheEnvironment() throws {
        let home = try Home(credentials: Self.credentialsFile)
        let found = try home.resolve("default", Self.environmentKeys)
        #expect(found.accessKeyID == "AKIDDEFAULT")
        #expect(found.secretAccessKey == "secretDefault/+1")
    }

    @Test func theDefaultProfile() throws {
        let home = try Home(credentials: Self.credentialsFile)
        #expect(try home.resolve() == AWSCredentials(accessKeyID: "AKIDDEFAULT", secretAccessKey: "secretDefault/+1",
                                                     sessionToken: nil, source: "profile default in \(home.path)/.aws/credentials"))
    }

    @Test func awsProfilePicksASectionWithItsSessionToken() throws {
        let home = try Home(credentials: Self.credentialsFile)
        #expect(try home.resolve(nil, ["AWS_PROFILE": "dev"]) == AWSCredentials(
            accessKeyID: "AKIDDEV", secretAccessKey: "secretDev/+2", sessionToken: "tokenDev==",
            source: "profile dev in \(home.path)/.aws/credentials"))
        #expect(try home.resolve("dev", ["AWS_PROFILE": "default"]).accessKeyID == "AKIDDEV")
    }

    @Test func profilesInTheConfigFile() throws {
        let home = try Home(config: """
            [default]
            aws_access_key_id = AKIDCONFIGDEFAULT
            aws_secret_access_key = secretConfig
            [prod]
            aws_access_key_id = AKIDWRONG
            aws_secret_access_key = secretConfig
            [profile prod]
            aws_access_key_id = AKIDCONFIGPROD
            aws_secret_access_key = secretConfig
            aws_session_token = tokenConfig
            """)
        #expect(try home.resolve() == AWSCredentials(accessKeyID: "AKIDCONFIGDEFAULT", secretAccessKey: "secretConfig",
                                                     sessionToken: nil, source: "profile default in \(home.path)/.aws/config"))
        #expect(try home.resolve("prod") == AWSCredentials(accessKeyID: "AKIDCONFIGPROD", secretAccessKey: "secretConfig",
                                                           sessionToken: "tokenConfig",
                                                           source: "profile prod in \(home.path)/.aws/config"))
    }

    @Test func theCredentialsFileWinsOverTheConfigFile() throws {
        let home = try Home(credentials: Self.credentialsFile, config: """
            [profile dev]
            aws_access_key_id = AKIDCONFIG
            aws_secret_access_key = secretConfig
            region = eu-west-3
            """)
        let found = try home.resolve("dev")
        #expect(found.accessKeyID == "AKIDDEV")
        #expect(found.secretAccessKey == "secretDev/+2")
        #expect(found.source == "profile dev in \(home.path)/.aws/credentials")
    }

    @Test func aMissingNamedProfileIsAnErrorThatNamesItAndTheFiles() throws {
        let home = try Home(credentials: Self.credentialsFile, config: "[profile other]\naws_secret_access_key = secretConfig\n")
        for failure in [home.failure("staging"), home.failure(nil, ["AWS_PROFILE": "staging"])] {
            let error = try #require(failure)
            #expect(error.errno == ENOENT)
            #expect(error.message == "AWS profile staging not found; looked in \(home.path)/.aws/credentials [staging] "
                + "and \(home.path)/.aws/config [profile staging]")
        }
    }

    @Test func nothingAnywhereIsAnError() throws {
        let home = try Home()
        let error = try #require(home.failure())
        #expect(error.errno == ENOENT)
        #expect(error.message == "no AWS credentials: AWS_ACCESS_KEY_ID is not set and there is no profile default; "
            + "looked in \(home.path)/.aws/credentials [default] and \(home.path)/.aws/config [default]")
    }

    @Test func anIncompleteProfileIsAnErrorWithoutTheSecret() throws {
        let home = try Home(credentials: Self.credentialsFile + "\n[empty]\n")
        let error = try #require(home.failure("half"))
        #expect(error.errno == EACCES)
        #expect(error.message == "AWS profile half has no aws_access_key_id; looked in \(home.path)/.aws/credentials [half] "
            + "and \(home.path)/.aws/config [profile half]")
        let empty = try #require(home.failure("empty"))
        #expect(empty.errno == EACCES)
        #expect(empty.message.hasPrefix("AWS profile empty has no aws_access_key_id or aws_secret_access_key; "))
        for message in [error.message, empty.message, error.description] {
            for secret in Self.secrets { #expect(!message.contains(secret)) }
        }
    }

    @Test func halfTheKeysInTheEnvironmentIsAnError() throws {
        let home = try Home(credentials: Self.credentialsFile)
        let error = try #require(home.failure(nil, ["AWS_SECRET_ACCESS_KEY": "secretEnv"]))
        #expect(error.errno == EACCES)
        #expect(error.message == "AWS_SECRET_ACCESS_KEY is set but AWS_ACCESS_KEY_ID is not")
        let other = try #require(home.failure(nil, ["AWS_ACCESS_KEY_ID": "AKIDENV", "AWS_SECRET_ACCESS_KEY": " "]))
        #expect(other.message == "AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not")
    }

    @Test func fileLocationsFromTheEnvironment() throws {
        let home = try Home(credentials: Self.credentialsFile, config: "[profile elsewhere]\nregion = us-west-2\n")
        try home.write("creds.ini", "[elsewhere]\naws_access_key_id = AKIDELSEWHERE\naws_secret_access_key = secretElsewhere\n")
        try home.write("conf.ini", "[profile elsewhere]\nregion = ap-south-1\n")
        let environment = ["AWS_SHARED_CREDENTIALS_FILE": home.path + "/creds.ini", "AWS_CONFIG_FILE": "~/conf.ini"]
        let found = try home.resolve("elsewhere", environment)
        #expect(found.accessKeyID == "AKIDELSEWHERE")
        #expect(found.source == "profile elsewhere in \(home.path)/creds.ini")
        #expect(home.region("elsewhere", environment) == "ap-south-1")
        // The usual files are not read when overridden.
        let error = try #require(home.failure("default", environment))
        #expect(error.message == "AWS profile default not found; looked in \(home.path)/creds.ini [default] "
            + "and \(home.path)/conf.ini [default]")
    }

    @Test func commentsAndWhitespace() throws {
        let home = try Home(credentials: """
            # a comment [dev]
            ; another = comment
              [ dev ]   ; the section
              aws_access_key_id=AKIDTIGHT
              AWS_Secret_Access_Key \t =   spaced/secret#kept   # a comment after whitespace
            ;aws_session_token = commented
            [profile   dev]
            aws_access_key_id = AKIDNOTTHISONE
            """)
        let found = try home.resolve("dev")
        #expect(found.accessKeyID == "AKIDTIGHT")
        #expect(found.secretAccessKey == "spaced/secret#kept")
        #expect(found.sessionToken == nil)
    }

    @Test func nestedSettingsAreSkipped() throws {
        let home = try Home(config: """
            [default]
            region = eu-central-1
            s3 =
              region = wrong-1
              addressing_style = path
            """)
        #expect(home.region() == "eu-central-1")
    }

    @Test func regionOrder() throws {
        let home = try Home(credentials: "[dev]\nregion = from-credentials-file\n", config: """
            [default]
            region = us-east-2
            [profile dev]
            region = eu-west-1
            """)
        let both = ["AWS_REGION": "ca-central-1", "AWS_DEFAULT_REGION": "sa-east-1"]
        #expect(home.region(nil, both) == "ca-central-1")
        #expect(home.region("dev", ["AWS_DEFAULT_REGION": "sa-east-1"]) == "sa-east-1")
        #expect(home.region("dev", ["AWS_REGION": ""]) == "eu-west-1")
        #expect(home.region(nil, ["AWS_PROFILE": "dev"]) == "eu-west-1")
        #expect(home.region() == "us-east-2")
        #expect(home.region("nothing") == nil)
        #expect(try Home().region() == nil)
    }

    @Test func anUnreadableFileIsAnError() throws {
        let home = try Home()
        try FileManager.default.createDirectory(atPath: home.path + "/.aws/credentials", withIntermediateDirectories: true)
        let error = try #require(home.failure())
        #expect(error.errno == EACCES)
        #expect(error.message.hasPrefix("cannot read AWS file: read \(home.path)/.aws/credentials: "))
    }

    @Test func descriptionsHideTheSecret() {
        let credentials = AWSCredentials(accessKeyID: "AKIDX", secretAccessKey: "secretDev/+2", sessionToken: "tokenDev==",
                                         source: "environment")
        #expect("\(credentials)" == "AWS credentials AKIDX (temporary) from environment")
        #expect(String(reflecting: credentials) == "AWS credentials AKIDX (temporary) from environment")
    }
}
