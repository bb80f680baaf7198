package workflows

import (
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/workflow"
)

func converterDecode(can *workflow.ContinueAsNewError, out any) error {
	return converter.GetDefaultDataConverter().FromPayloads(can.Input, out)
}
