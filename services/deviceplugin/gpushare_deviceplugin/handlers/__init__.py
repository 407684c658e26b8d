"""Pure logic of each plugin kind: device lists, Allocate and GetPreferredAllocation."""
