// The tidyjax timeline page's hover and device selector, inlined into each page by
// tidyjax/_timeline_html.py, which puts the page's root element id in getElementById below.
// Without this script each chart is an <img> of a standalone SVG (what sanitizers keep); the
// script swaps each image for the live SVG decoded from it, then adds the hover, the tooltip
// and the device selector.
(function(){
var root=document.getElementById("%ID%");
if(!root||root.dataset.ready)return;
root.dataset.ready="1";
var data=JSON.parse(root.querySelector("script.tj-data").textContent);
root.querySelectorAll("img.tj-static").forEach(function(img){
  var bin=atob(img.getAttribute("src").split(",")[1]);
  var bytes=new Uint8Array(bin.length);
  for(var k=0;k<bin.length;k++)bytes[k]=bin.charCodeAt(k);
  var doc=new DOMParser().parseFromString(new TextDecoder().decode(bytes),"image/svg+xml");
  doc.querySelectorAll(".tj-own").forEach(function(e){e.remove()});  // its own style, backdrop
  var svg=document.importNode(doc.documentElement,true);
  svg.removeAttribute("width");svg.removeAttribute("height");
  img.replaceWith(svg)});
var tip=document.createElement("div");
tip.className="tj-tip";tip.hidden=true;root.appendChild(tip);
if(data.devices.length>1){
  var group=document.createElement("div");
  group.className="tj-devices";group.setAttribute("role","group");
  group.setAttribute("aria-label","device");
  data.devices.forEach(function(d,j){
    var b=document.createElement("button");b.type="button";b.dataset.device=String(j);
    b.textContent=d.label;group.appendChild(b)});
  root.insertBefore(group,root.querySelector(".tj-chart"))}
function fmt(n){
  var u=["B","KiB","MiB","GiB"],i=0;
  while(Math.abs(n)>=1024&&i<3){n/=1024;i++}
  return i?n.toFixed(1)+" "+u[i]:Math.round(n)+" B"}
function dt(s){
  return s<1?"+"+(s*1e3).toFixed(1)+" ms":s<120?"+"+s.toFixed(2)+" s":"+"+(s/60).toFixed(1)+" min"}
function line(text,bold){
  var e=document.createElement(bold?"b":"div");e.textContent=text;tip.appendChild(e)}
var buttons=root.querySelectorAll(".tj-devices button");
function show(d){
  root.querySelectorAll(".tj-chart").forEach(function(c){c.hidden=+c.dataset.device!==d});
  buttons.forEach(function(b){b.setAttribute("aria-pressed",String(+b.dataset.device===d))})}
buttons.forEach(function(b){b.addEventListener("click",function(){show(+b.dataset.device)})});
show(data.selected);
root.querySelectorAll(".tj-area title").forEach(function(t){t.remove()});
root.querySelectorAll(".tj-chart").forEach(function(chart){
  var dev=data.devices[+chart.dataset.device],L=data.layout;
  var svg=chart.querySelector("svg.tj-svg"),areas=svg.querySelectorAll(".tj-area");
  function hide(){tip.hidden=true;areas.forEach(function(a){a.classList.remove("tj-hot")})}
  svg.addEventListener("mouseleave",hide);
  svg.addEventListener("mousemove",function(e){
    var p=svg.createSVGPoint();p.x=e.clientX;p.y=e.clientY;
    var q=p.matrixTransform(svg.getScreenCTM().inverse());
    var c=Math.floor((q.x-L.x0)/L.pw*data.columns);
    if(c<0||c>=data.columns||q.y<L.y0||q.y>L.y0+L.ph){hide();return}
    var col=dev.cols[c],v=(L.y0+L.ph-q.y)/L.ph*dev.vmax,cum=0,s=-1,tot=0,i;
    for(i=0;i<col.length;i++)tot+=col[i];
    for(i=0;i<col.length;i++){if(col[i]>0&&v>=cum&&v<cum+col[i]){s=i;break}cum+=col[i]}
    if(s<0){hide();return}
    var site=data.sites[s];
    areas.forEach(function(a){a.classList.toggle("tj-hot",+a.dataset.site===s)});
    tip.textContent="";line(site.label,true);
    line(fmt(col[s])+" of "+fmt(tot)+" live on "+dev.name+", at "+dt(data.times[c]));
    line("shapes: "+site.shapes);line("dtype: "+site.dtypes);line("scope: "+site.scopes);
    var r=root.getBoundingClientRect(),x=e.clientX-r.left+14;tip.hidden=false;
    if(x+tip.offsetWidth>r.width)x=Math.max(0,e.clientX-r.left-tip.offsetWidth-14);
    tip.style.left=x+"px";tip.style.top=(e.clientY-r.top+14)+"px"})});
})();
