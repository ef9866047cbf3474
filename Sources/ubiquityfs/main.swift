import UbiquityCLI
UbiquityCommand.main()
