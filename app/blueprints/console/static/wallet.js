/* The billing page's wallet steps (issue 40 item 5), only when a browser wallet is present
   (window.ethereum, EIP-1193): fill the address from the wallet, and sign the shown message
   with personal_sign (EIP-191) into the signature field. Without it, the forms work as they
   are: the address typed, the signature pasted. Served by the app (the CSP allows no inline script). */
"use strict";
(function () {
  var eth = window.ethereum;
  if (!eth || typeof eth.request !== "function") return;
  var hex = function (text) {
    var bytes = new TextEncoder().encode(text), out = "0x";
    for (var i = 0; i < bytes.length; i++) out += ("0" + bytes[i].toString(16)).slice(-2);
    return out;
  };
  var detect = document.getElementById("wallet-detect");
  var chain = document.getElementById("f-chain");
  if (detect && chain) {
    detect.hidden = false;
    detect.addEventListener("click", function () {
      eth.request({method: "eth_requestAccounts"}).then(function (accounts) {
        if (accounts && accounts[0]) document.getElementById("f-address").value = accounts[0];
        if (chain.value === "solana") chain.value = "base";
      });
    });
  }
  var sign = document.getElementById("wallet-sign");
  var form = document.getElementById("wallet-connect");
  if (sign && form && form.dataset.chain !== "solana") {
    sign.hidden = false;
    sign.addEventListener("click", function () {
      var message = document.getElementById("sign-message").textContent;
      eth.request({method: "personal_sign", params: [hex(message), form.dataset.address]}).then(function (signature) {
        document.getElementById("f-signature").value = signature;
        form.submit();
      }, function (err) {
        sign.textContent = "The wallet did not sign: " + ((err && err.message) || "refused");
      });
    });
  }
})();
