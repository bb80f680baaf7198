# Rules every native worker's Makefile shares: the runtime identifier (RID)
# of the machine, where the library goes in the package, and `make package`,
# which zips manifest.json and runtimes/ into $(BUILD)/$(NAME).zip.
#
# Set SDK, NAME (the zip's base name) and LIBNAME (the library's file name)
# before `include $(SDK)/package.mk`; then build $(LIB).
# Cross-building another architecture: make package RID=linux-arm64 CC=...
BUILD ?= build
ARCH  := $(shell uname -m)
RID   ?= $(if $(filter x86_64 amd64,$(ARCH)),linux-x64,$(if $(filter aarch64 arm64,$(ARCH)),linux-arm64,unknown-$(ARCH)))
LIB   := $(BUILD)/pkg/runtimes/$(RID)/native/$(LIBNAME)

.DEFAULT_GOAL := all

all: $(LIB)

package: $(BUILD)/$(NAME).zip

$(BUILD)/$(NAME).zip: $(LIB) manifest.json
	cp manifest.json $(BUILD)/pkg/manifest.json
	rm -f $@
	cd $(BUILD)/pkg && python3 -m zipfile -c ../$(NAME).zip manifest.json runtimes
	@echo "packaged $@ (upload it with MIME type application/x-native-dll)"

clean:
	rm -rf $(BUILD)

.PHONY: all package clean
