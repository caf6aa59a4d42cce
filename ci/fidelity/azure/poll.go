package main

import (
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
)

// Pollers poll every second (the SDK's minimum; its default, 30 s, is for real ARM; the emulator's
// operations run for a few hundred milliseconds).
func runtime_PollUntilDoneOptions() runtime.PollUntilDoneOptions {
	return runtime.PollUntilDoneOptions{Frequency: time.Second}
}
