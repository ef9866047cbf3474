import Testing
@testable import UbiquityControl
