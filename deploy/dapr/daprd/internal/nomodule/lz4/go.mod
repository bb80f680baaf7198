module github.com/pierrec/lz4
