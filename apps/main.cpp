#include <iostream>
#include "kvattn/kvattn.h"
int main() { std::cout << "kvattn " << kvattn::kVersion << "\n"; }
