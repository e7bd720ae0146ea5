# Reference values of the paired-difference intervals that lmpipe.report.stats computes, from the
# R package contingencytables (Fagerland, Lydersen and Laake, "Statistical Analysis of Contingency
# Tables", 2017; github.com/ocbe-uio/contingencytables, R/Newcombe_square_and_add_CI_paired_2x2.R,
# R/Wald_CI_AgrestiMin_paired_2x2.R, R/Wilson_score_CI_1x2.R), sourced from a checkout of it:
#
#   Rscript tests/reference/paired_difference.R CHECKOUT > tests/reference/paired_difference.csv
#
# The table: n11 both right, n12 only the first right, n21 only the second right, n22 both wrong.
args <- commandArgs(trailingOnly = TRUE)
validateArguments <- function(...) invisible(NULL)
contingencytables_result <- function(x, ...) x
for (f in c("Wilson_score_CI_1x2", "Newcombe_square_and_add_CI_paired_2x2",
            "Wald_CI_AgrestiMin_paired_2x2")) {
  source(file.path(args[1], "R", paste0(f, ".R")))
}
cat("n11,n12,n21,n22,newcombe_lower,newcombe_upper,agresti_min_lower,agresti_min_upper\n")
for (n in c(10, 50, 200, 1000, 10042)) {
  for (b in unique(round(n * c(0, 0.01, 0.03, 0.1, 0.3)))) {
    for (c in unique(round(n * c(0, 0.005, 0.02, 0.1, 0.25)))) {
      rest <- n - b - c
      if (rest < 0) next
      for (share in c(0, 0.5, 0.9)) {
        n11 <- round(rest * share)
        t <- matrix(c(n11, c, b, rest - n11), 2)  # column-major: n11, n21, n12, n22
        nc <- Newcombe_square_and_add_CI_paired_2x2(t)
        am <- Wald_CI_AgrestiMin_paired_2x2(t)
        cat(sprintf("%d,%d,%d,%d,%.10f,%.10f,%.10f,%.10f\n", n11, b, c, rest - n11,
                    nc$lower, nc$upper, am$lower, am$upper))
      }
    }
  }
}
