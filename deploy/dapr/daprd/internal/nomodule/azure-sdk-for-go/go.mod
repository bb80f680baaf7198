module github.com/Azure/azure-sdk-for-go
