module github.com/jobq/jobq/clients/go

go 1.19
