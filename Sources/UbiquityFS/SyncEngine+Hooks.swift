import UbiquitySync
extension SyncEngine: SyncHooks {}
