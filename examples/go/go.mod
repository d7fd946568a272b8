module example.invalid/sigma/sigmalock

go 1.19
