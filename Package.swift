// swift-tools-version:6.0
import PackageDescription

let swiftSettings: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
]

let package = Package(
    name: "UbiquityFS",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "ubiquityfs", targets: ["ubiquityfs"]),
        // iCloud Documents' API for Swift apps on Linux (docs/UBIQUITYKIT.md).
        .library(name: "UbiquityKit", targets: ["UbiquityKit"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/groue/GRDB.swift", from: "7.10.0"),
        .package(url: "https://github.com/apple/swift-crypto", from: "3.12.3"),
        .package(url: "https://github.com/swift-server/async-http-client", from: "1.37.0"),
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.2"),
    ],
    targets: [
        .systemLibrary(name: "CFuse3", pkgConfig: "fuse3", providers: [.apt(["libfuse3-dev"])]),
        .target(name: "CLinux"),
        .target(name: "CFuseWire", dependencies: ["CFuse3"]),
        // Optimised in debug builds too: at -O0 the SHA kernel runs a twentieth as fast.
        .target(name: "CHashLanes", cSettings: [.unsafeFlags(["-O2"], .when(configuration: .debug))]),
        // The one lock type (`Lock`): a pthread mutex, which ThreadSanitizer sees.
        .target(name: "UbiquityLocks"),
        // What a container is, as every layer sees it: items, change sets, journal and
        // snapshot records, file names, the one error type. No C, no I/O.
        .target(name: "UbiquityModel", dependencies: ["UbiquityLocks"], swiftSettings: swiftSettings),
        // The Linux helpers: system calls Swift's Glibc lacks (CLinux), retried, failing as UbiquityErrors.
        .target(name: "UbiquityLinux", dependencies: ["CLinux", "UbiquityModel"], swiftSettings: swiftSettings),
        // The stores (the protocol, the folder store) and content hashing.
        .target(
            name: "UbiquityStore",
            dependencies: ["UbiquityModel", "UbiquityLinux", "UbiquityLocks", "CLinux", "CHashLanes", .product(name: "Crypto", package: "swift-crypto")],
            swiftSettings: swiftSettings),
        .target(
            name: "UbiquityS3",
            dependencies: [
                "UbiquityStore", "UbiquityModel", "UbiquityLinux",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings),
        // Finding this device's mounts and their daemons: shared by the daemon, the CLI and UbiquityKit.
        .target(
            name: "UbiquityLocator",
            dependencies: [.product(name: "Crypto", package: "swift-crypto")],
            swiftSettings: swiftSettings),
        .target(
            name: "UbiquityReplica",
            dependencies: ["UbiquityStore", "UbiquityModel", "UbiquityLinux", "UbiquityLocks", "UbiquityLocator", .product(name: "GRDB", package: "GRDB.swift")],
            swiftSettings: swiftSettings),
        .target(
            name: "UbiquitySync",
            dependencies: ["UbiquityStore", "UbiquityModel", "UbiquityLinux", "UbiquityLocks", "UbiquityReplica", "UbiquityProtocol", .product(name: "Logging", package: "swift-log"), .product(name: "GRDB", package: "GRDB.swift")],
            swiftSettings: swiftSettings),
        .target(
            name: "UbiquityFS",
            dependencies: ["UbiquityStore", "UbiquityModel", "UbiquityLinux", "UbiquityLocks", "UbiquityReplica", .product(name: "Logging", package: "swift-log")],
            swiftSettings: swiftSettings),
        .target(
            name: "UbiquityControl",
            dependencies: [],
            swiftSettings: swiftSettings),
        .target(
            name: "UbiquityFUSE",
            dependencies: ["CFuse3", "CFuseWire", "UbiquityFS", "UbiquityReplica", "UbiquityModel", "UbiquityLinux", "UbiquityLocks", "UbiquityLocator",
                           .product(name: "Logging", package: "swift-log")],
            swiftSettings: swiftSettings),
        .target(name: "UbiquityProtocol", swiftSettings: swiftSettings),
        // Talks to the daemon only through UbiquityProtocol: no libfuse, SQLite or daemon code.
        // Apple's NSPredicate and NSSortDescriptor, which UbiquityKit re-exports by name (they win over Foundation's).
        .target(name: "UbiquityPredicates", swiftSettings: swiftSettings),
        .target(name: "UbiquityKit", dependencies: ["UbiquityLocks", "UbiquityProtocol", "UbiquityLocator", "UbiquityPredicates"], swiftSettings: swiftSettings),
        .target(
            name: "UbiquityDaemon",
            dependencies: [
                "UbiquityProtocol", "UbiquityFUSE", "UbiquityFS", "UbiquitySync", "UbiquityReplica", "UbiquityStore", "UbiquityModel", "UbiquityLinux", "UbiquityControl", "UbiquityS3",
                "UbiquityLocks", "UbiquityLocator",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings),
        .target(
            name: "UbiquityCLI",
            dependencies: [
                "UbiquityDaemon", "UbiquityProtocol", "UbiquityLocator", "UbiquityFUSE", "UbiquitySync", "UbiquityReplica", "UbiquityStore", "UbiquityModel", "UbiquityControl", "UbiquityS3",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings),
        .executableTarget(name: "ubiquityfs", dependencies: ["UbiquityCLI"], swiftSettings: swiftSettings),
        // Stores for tests (in memory, with injected faults): never in the product.
        .target(name: "UbiquityTesting", dependencies: ["UbiquityStore", "UbiquityModel", "UbiquityLocks"], swiftSettings: swiftSettings),
        // The command with fault injection (UBIQUITYFS_FAULTS) for the mount tests: built, never installed.
        .executableTarget(name: "ubiquityfs-testing", dependencies: ["UbiquityCLI", "UbiquityDaemon", "UbiquityReplica", "UbiquityTesting"],
                          path: "Tests/ubiquityfs-testing", swiftSettings: swiftSettings),
        // The seeds' samples on UbiquityKit (docs/UBIQUITYKIT.md); Swift 5 mode, as the seeds were written.
        .executableTarget(name: "ubiquitykit-item-query", dependencies: ["UbiquityKit"], path: "Examples/ItemQuery",
                         swiftSettings: [.swiftLanguageMode(.v5)]),
        .executableTarget(name: "ubiquitykit-document-list", dependencies: ["UbiquityKit"], path: "Examples/DocumentList",
                          swiftSettings: [.swiftLanguageMode(.v5)]),
        .executableTarget(name: "ubiquitykit-folder-monitor", dependencies: ["UbiquityKit"], path: "Examples/FolderMonitor",
                          swiftSettings: [.swiftLanguageMode(.v5)]),
        .executableTarget(name: "ubiquitykit-documents-handler", dependencies: ["UbiquityKit"], path: "Examples/DocumentsHandler",
                          swiftSettings: [.swiftLanguageMode(.v5)]),
        .executableTarget(name: "ubiquitykit-document-editor", dependencies: ["UbiquityKit"], path: "Examples/DocumentEditor",
                          swiftSettings: [.swiftLanguageMode(.v5)]),
        // A small real app using all of it, in Swift 6 mode (strict concurrency).
        .executableTarget(name: "ubiquitykit-notes", dependencies: ["UbiquityKit"], path: "Examples/Notes", swiftSettings: swiftSettings),
        .testTarget(name: "UbiquityKitTests", dependencies: ["UbiquityKit"], swiftSettings: swiftSettings),
        .testTarget(
            name: "UbiquityControlTests",
            dependencies: ["UbiquityControl"],
            swiftSettings: swiftSettings),
        .testTarget(
            name: "UbiquityS3Tests",
            dependencies: ["UbiquityS3", "UbiquityStore", "UbiquityModel", "UbiquityTesting"],
            swiftSettings: swiftSettings),
        .testTarget(
            name: "UbiquityDaemonTests",
            dependencies: ["UbiquityDaemon", "UbiquityProtocol", "UbiquityControl", "UbiquitySync", "UbiquityReplica", "UbiquityStore", "UbiquityModel",
                           .product(name: "Logging", package: "swift-log")],
            swiftSettings: swiftSettings),
        .testTarget(
            name: "UbiquityCoreTests",
            dependencies: ["UbiquityFS", "UbiquitySync", "UbiquityReplica", "UbiquityStore", "UbiquityModel", "UbiquityTesting"],
            swiftSettings: swiftSettings),
    ]
)
